"""What a decode returns and keeps as it runs: the generated tokens, their statistics and timings, and when each
request arrived, had its first token and finished."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from dspark.metrics import AcceptanceStats


@dataclass(frozen=True)
class RequestTiming:
    """When one request arrived, had its first token and had its last, in seconds since decoding began.

    A request arrives when the decoder starts admitting it: at the start for those that fit in the first batch, and
    under continuous batching (``max_batch``) when a finished request's place comes free, as the next request of a
    closed-loop client would. Requests admitted together are prefilled one after another, so a request's time to
    first token includes the prefills queued before its own.
    """

    arrived: float
    first_token: float
    finished: float

    @property
    def time_to_first_token(self) -> float:
        return self.first_token - self.arrived


class RequestClock:
    """Collects :class:`RequestTiming` per request as a decode admits, starts and finishes them."""

    def __init__(self, num_requests: int, start: float):
        self.start = start
        self.marks = {name: [float("nan")] * num_requests for name in ("arrived", "first_token", "finished")}

    def mark(self, name: str, rows) -> None:
        now = time.perf_counter() - self.start
        for row in rows:
            self.marks[name][int(row)] = now

    def timings(self) -> list[RequestTiming]:
        return [RequestTiming(*values) for values in zip(*self.marks.values())]


@dataclass
class GenerationResult:
    """Generated token ids per request (prompt excluded), acceptance statistics and where the time went.

    ``steps`` counts the target's forward passes after the prefill (decoding steps, or speculative rounds);
    ``timings`` splits the seconds: ``prefill`` and ``decode`` for plain decoding; ``prefill``, ``draft``,
    ``schedule``, ``target`` (the verify pass's forward), ``verify`` (warping, rejection sampling, cache
    roll-back and the drafter's cache update) and ``bookkeeping`` (statistics, outputs, finished requests)
    for speculative decoding (``draft`` includes bringing the drafter's cache up to date after rounds that drafted
    nothing). ``rounds_without_drafts`` counts the speculative rounds in which the scheduler could
    not have sent any draft, so the drafter was not run and the round was a plain target step.
    ``request_rounds[i]`` counts the speculative rounds request ``i`` took part in; every token of it but the
    first (sampled after the prefill) was committed by one of them, so :attr:`request_tau` is its own τ, the
    unit that comparisons paired over the same prompts resample. ``request_timings[i]`` says when request ``i``
    arrived, had its first token and finished (:class:`RequestTiming`).
    """

    tokens: list[list[int]]
    seconds: float
    stats: AcceptanceStats | None = None
    timings: dict[str, float] = field(default_factory=dict)
    steps: int = 0
    rounds_without_drafts: int = 0
    request_rounds: list[int] = field(default_factory=list)
    request_timings: list[RequestTiming] = field(default_factory=list)

    @property
    def new_tokens(self) -> int:
        return sum(len(t) for t in self.tokens)

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else float("nan")

    @property
    def request_tau(self) -> list[float]:
        """τ of each request: tokens committed by its rounds over its rounds (NaN if it took part in none)."""
        return [(len(t) - 1) / n if n else float("nan") for t, n in zip(self.tokens, self.request_rounds)]

    def table(self):
        """τ, acceptance by position (conditional and unconditional), tokens/s and the time split, as a
        :class:`dspark.report.Table` (``print`` it, ``display`` it, ``to_frame()`` it)."""
        from dspark.report import Table

        row = {"tokens": self.new_tokens, "tps": self.tokens_per_second, **{k: v for k, v in self.timings.items()}}
        columns = [("tokens", "new tokens"), ("tps", "tokens/s")]
        if self.stats is not None:
            row.update(tau=self.stats.tau, cond=self.stats.conditional.tolist(),
                       uncond=self.stats.unconditional.tolist())
            columns += [("tau", "τ"), ("cond", "acceptance | prefix accepted"), ("uncond", "acceptance, unconditional")]
        columns += [(k, f"{k} s") for k in self.timings]
        return Table([row], columns, title=f"{len(self.tokens)} request(s), {self.seconds:.2f} s")

    def _repr_html_(self) -> str:
        return self.table()._repr_html_()

    def summary(self) -> dict:
        out = {"new_tokens": self.new_tokens, "seconds": self.seconds, "tokens_per_second": self.tokens_per_second,
               "timings": dict(self.timings), "steps": self.steps, "rounds_without_drafts": self.rounds_without_drafts}
        if self.stats is not None:
            out.update(self.stats.as_dict())
        return out


class TokenBuffer:
    """Generated tokens of every request in one buffer ``[B, max_new_tokens]``: appended to and tested for
    completion with tensor ops, so a decoding step does no Python work per request."""

    def __init__(self, num_requests: int, max_new_tokens: int, eos: int | None):
        self.tokens = torch.zeros(num_requests, max_new_tokens, dtype=torch.long)
        self.count = torch.zeros(num_requests, dtype=torch.long)
        self.eos, self.max_new_tokens = eos, max_new_tokens

    def append(self, rows: torch.Tensor, new: torch.Tensor, num_new: torch.Tensor) -> None:
        """Append the first ``num_new[i]`` tokens of ``new [n, w]`` to request ``rows[i]``."""
        new, num_new = new.cpu(), num_new.cpu()
        slots = self.count[rows, None] + torch.arange(new.shape[1])
        keep = torch.arange(new.shape[1]) < num_new[:, None]
        self.tokens[rows[:, None].expand_as(slots)[keep], slots[keep]] = new[keep]
        self.count[rows] += num_new

    def finished(self, rows: torch.Tensor) -> torch.Tensor:
        """``[len(rows)]`` bool: the request's last token is EOS, or it has all its tokens."""
        count = self.count[rows]
        done = count >= self.max_new_tokens
        if self.eos is not None:
            done |= self.tokens[rows, (count - 1).clamp(min=0)] == self.eos
        return done

    def lists(self) -> list[list[int]]:
        return [row[:n].tolist() for row, n in zip(self.tokens, self.count.tolist())]
