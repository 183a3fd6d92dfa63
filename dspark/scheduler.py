"""Hardware-aware prefix scheduling (method.md §6): how many drafted tokens each request sends to the target.

Request r with survivals ``a_{r,1} ≥ … ≥ a_{r,γ}`` (``a_{r,j} = Π_{i≤j} c_{r,i}``) and verify length ℓ_r
costs ``1 + ℓ_r`` tokens in the verify pass and yields ``1 + Σ_{j≤ℓ_r} a_{r,j}`` tokens in expectation. With
``B = base + Σ_r (1 + ℓ_r)`` tokens in the pass and ``SPS(B)`` target steps per second, the scheduler
maximises the expected tokens per second ``Θ = τ · SPS(B)``.

Candidates ``(r, j)`` are ranked by survival, descending; ties go to the earlier position, which keeps
every admitted set a prefix of each request. Entries with equal survival *at the same position* form a
group that is admitted whole or not at all, so the result never depends on the order of requests.

* :func:`schedule_greedy` with ``early_stop=True`` is Algorithm 1: admit groups while Θ strictly rises,
  stop at the first that does not. The stop is what keeps verification lossless (method.md §6.2, App. A):
  admission of slot j never looks at the survival of slot j+1, which depends on the sampled x_j.
* ``early_stop=False`` is the unconstrained global argmax; it is lossless only on confidences that do
  not depend on the current step's samples, which is how the production variant sizes its budget.
* :func:`allocate_top_k` is the production allocation: the top-K ranked entries, K fixed beforehand.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from dspark._checks import check_once, check_tensor, values_checked
from dspark.backend import resolve_backend


@dataclass
class SPSTable:
    """Target steps per second with B tokens in the verify pass, for B = 0 … ``max_tokens``.

    ``sps`` is non-increasing: a pass with more tokens is never faster (measured tables are made monotone
    by :meth:`from_latencies`). Index 0 is unused by the schedulers (every request sends its anchor).
    """

    sps: torch.Tensor
    _copies: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def on(self, device: torch.device) -> torch.Tensor:
        """``sps`` on ``device``, copied there once (a decode loop's scheduler reads the table every round); a new
        ``sps`` tensor assigned to the table is copied anew."""
        source, copy = self._copies.get(device, (None, None))
        if source is not self.sps:
            copy = self.sps.to(device)
            self._copies[device] = (self.sps, copy)
        return copy

    def __post_init__(self) -> None:
        self.sps = torch.as_tensor(self.sps, dtype=torch.float64).cpu()
        check_tensor("sps", self.sps, ndim=1, floating=True, finite=True)
        if self.sps.numel() < 2 or bool((self.sps[1:] <= 0).any()):
            raise ValueError("an SPS table needs positive steps/s for B = 1 … max_tokens")
        if bool((self.sps[2:] > self.sps[1:-1]).any()):
            raise ValueError("SPS must be non-increasing in B; build measured tables with SPSTable.from_latencies")

    @property
    def max_tokens(self) -> int:
        return self.sps.numel() - 1

    @classmethod
    def from_latencies(cls, tokens: Sequence[int], seconds: Sequence[float], max_tokens: int | None = None) -> SPSTable:
        """A monotone table from measured step latencies at some token counts.

        Latencies are made non-decreasing (a running maximum, as vLLM forces its cost tables monotone),
        interpolated linearly between measured counts, and held flat below the first one. Beyond the
        last measured count nothing is known, so ``max_tokens`` defaults to it.
        """
        if len(tokens) != len(seconds) or not tokens:
            raise ValueError("tokens and seconds must be non-empty and of equal length")
        pairs = sorted(zip(tokens, seconds))
        xs = torch.tensor([float(t) for t, _ in pairs], dtype=torch.float64)
        ys = torch.tensor([float(s) for _, s in pairs], dtype=torch.float64).cummax(0).values
        if bool((xs < 1).any()) or bool((ys <= 0).any()) or len(set(xs.tolist())) != len(xs):
            raise ValueError("token counts must be distinct and >= 1, latencies positive")
        max_tokens = int(xs[-1]) if max_tokens is None else max_tokens
        if max_tokens > xs[-1]:
            raise ValueError(f"max_tokens {max_tokens} lies beyond the last measured count {int(xs[-1])}")
        grid = torch.arange(max_tokens + 1, dtype=torch.float64)
        idx = torch.searchsorted(xs, grid).clamp(1, max(len(xs) - 1, 1))
        if len(xs) == 1:
            latency = ys.expand(grid.shape)
        else:
            x0, x1, y0, y1 = xs[idx - 1], xs[idx], ys[idx - 1], ys[idx]
            latency = torch.where(grid <= xs[0], ys[0], y0 + (y1 - y0) * (grid - x0) / (x1 - x0))
        return cls((1.0 / latency).cummin(0).values)

    @classmethod
    def linear(cls, fixed_seconds: float, seconds_per_token: float, max_tokens: int) -> SPSTable:
        """``SPS(B) = 1 / (fixed + B · per_token)``: Θ is then unimodal along the greedy path."""
        grid = torch.arange(max_tokens + 1, dtype=torch.float64)
        return cls(1.0 / (fixed_seconds + seconds_per_token * grid))

    @classmethod
    def roofline(
        cls,
        *,
        weight_bytes: float,
        flops_per_token: float,
        bandwidth_bytes_per_s: float,
        peak_flops: float,
        overhead_s: float,
        max_tokens: int,
    ) -> SPSTable:
        """A stated model of a GPU verify pass: ``max(weights / bandwidth, B · flops / peak) + overhead``.

        Flat while the pass is memory-bound (small B), rising once compute dominates: the regime where a
        scheduler must send fewer drafts per request as load grows.
        """
        grid = torch.arange(max_tokens + 1, dtype=torch.float64)
        latency = torch.maximum(torch.full_like(grid, weight_bytes / bandwidth_bytes_per_s),
                                grid * flops_per_token / peak_flops) + overhead_s
        return cls(1.0 / latency)

    def __call__(self, tokens: int) -> float:
        return float(self.sps[tokens])


def profile_sps(
    step: Callable[[int], None], token_counts: Sequence[int], *, repeats: int = 5, warmup: int = 1
) -> SPSTable:
    """Measure ``step(B)`` (one verify pass of B tokens) at each count; median of ``repeats``; monotone table.

    The counts take turns, one pass of each per round, so that a stretch in which the machine runs slow (other
    work on a shared CPU) lengthens a pass of every count a little instead of every pass of one count: the
    running maximum that makes the table monotone would carry such an outlier up to every larger count. On a
    GPU ``step`` must synchronise before returning. This is how the engine's table is profiled once at start-up
    (method.md §6.1).
    """
    for _ in range(warmup):
        for count in token_counts:
            step(count)
    times: list[list[float]] = [[] for _ in token_counts]
    for _ in range(repeats):
        for count, samples in zip(token_counts, times):
            start = time.perf_counter()
            step(count)
            samples.append(time.perf_counter() - start)
    return SPSTable.from_latencies(list(token_counts), [statistics.median(samples) for samples in times])


def survival_of(confidence: torch.Tensor) -> torch.Tensor:
    """``a_{r,j} = Π_{i≤j} c_{r,i}`` in float64, multiplied left to right on the CPU.

    The order is fixed so that equal inputs give bit-equal survivals on every backend: ties decide groups.
    """
    return confidence.detach().double().cpu().cumprod(-1)


def _ranked_groups(survival: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor):
    """Rank candidate entries; return (requests, values, group ids, group sizes) in rank order.

    Candidates are slots j (1-based) with ``lo_r < j ≤ hi_r`` and positive survival.
    """
    num_requests, gamma = survival.shape
    slots = torch.arange(1, gamma + 1)
    candidate = (slots > lo[:, None]) & (slots <= hi[:, None]) & (survival > 0)
    # Flatten position-major so a stable sort on -survival breaks ties by position (then request index,
    # which only orders entries inside a group, never which are admitted).
    values = survival.T.reshape(-1)
    positions = slots.repeat_interleave(num_requests)
    requests = torch.arange(num_requests).repeat(gamma)
    keep = candidate.T.reshape(-1)
    values, positions, requests = values[keep], positions[keep], requests[keep]
    order = torch.sort(-values, stable=True).indices
    values, positions, requests = values[order], positions[order], requests[order]
    new_group = torch.ones_like(values, dtype=torch.bool)
    new_group[1:] = (values[1:] != values[:-1]) | (positions[1:] != positions[:-1])
    group = new_group.cumsum(0) - 1
    return requests, values, group, new_group


def verify_length_bounds(survival, valid_len, min_len, max_len):
    """``(lo [R], hi [R])``: the fewest and most drafted tokens each request may send, on the CPU. ``hi`` is γ
    (``survival [R, γ]``), capped by ``valid_len [R]`` and ``max_len``; ``lo`` is ``min_len`` capped by ``hi``."""
    gamma = survival.shape[1]
    hi = torch.full((survival.shape[0],), gamma, dtype=torch.long) if valid_len is None else valid_len.long().cpu()
    if max_len is not None:
        hi = hi.clamp(max=max_len)
    lo = torch.full_like(hi, min_len).minimum(hi)
    return lo, hi


def schedule_greedy(
    confidence: torch.Tensor,
    sps: SPSTable,
    valid_len: torch.Tensor | None = None,
    *,
    early_stop: bool = True,
    min_len: int = 0,
    max_len: int | None = None,
    base_tokens: int = 0,
    backend: str = "auto",
) -> torch.Tensor:
    """Algorithm 1 (method.md §6.2): verify lengths maximising ``Θ = τ · SPS(B)``.

    Args:
        confidence: ``[R, γ]`` calibrated conditional confidences ``c_{r,j}`` in ``[0, 1]``.
        sps: the target's throughput table; B never exceeds ``sps.max_tokens`` (the capacity).
        valid_len: ``[R]`` slots actually drafted (shorter near EOS or max tokens); default γ.
        early_stop: Algorithm 1's break (lossless); ``False`` is the global argmax over the ranked path.
        min_len, max_len: per-request bounds on the verify length (``min_len`` slots are always sent).
        base_tokens: non-draft tokens already in the pass (prefills of other requests).

    Returns:
        ``[R]`` int64 verify lengths, each in ``[min(min_len, valid_len), min(valid_len, max_len)]``.
    """
    check_once(_check_schedule_inputs, confidence, valid_len, min_len, max_len, base_tokens)
    if not isinstance(sps, SPSTable):
        raise ValueError(f"sps must be an SPSTable (SPSTable.from_latencies, .linear, .roofline or profile_sps), "
                         f"got {type(sps).__name__}")
    check_schedule_capacity(confidence, valid_len, min_len, max_len, base_tokens, sps)  # every tier refuses alike
    backend = resolve_backend(backend, confidence)
    if backend == "reference":
        from dspark.reference.scheduler import schedule_greedy as reference_schedule_greedy

        return reference_schedule_greedy(confidence, sps, valid_len, early_stop=early_stop, min_len=min_len,
                                         max_len=max_len, base_tokens=base_tokens)
    if backend == "triton":
        from dspark.kernels import schedule_greedy as triton_schedule_greedy

        return triton_schedule_greedy(confidence, sps, valid_len, early_stop=early_stop, min_len=min_len,
                                      max_len=max_len, base_tokens=base_tokens)
    device = confidence.device
    survival = survival_of(confidence)
    num_requests = survival.shape[0]
    lo, hi = verify_length_bounds(survival, valid_len, min_len, max_len)
    slots = torch.arange(1, survival.shape[1] + 1)
    tokens0 = base_tokens + num_requests + int(lo.sum())
    tau0 = num_requests + float((survival * (slots <= lo[:, None])).sum())
    requests, values, group, new_group = _ranked_groups(survival, lo, hi)
    # Θ after admitting each whole group (evaluated at group ends).
    tokens = tokens0 + torch.arange(1, values.numel() + 1)
    tau = tau0 + values.cumsum(0)
    group_end = torch.ones_like(new_group)
    group_end[:-1] = new_group[1:]
    tokens, tau = tokens[group_end], tau[group_end]
    fits = tokens <= sps.max_tokens
    theta = torch.cat([torch.tensor([tau0 * sps(tokens0)]), tau[fits] * sps.sps[tokens[fits]]])
    if early_stop:
        rising = theta[1:] > theta[:-1]
        admitted_groups = int(rising.long().cumprod(0).sum())
    else:
        admitted_groups = int(theta.argmax())
    admitted = group < admitted_groups
    extra = torch.bincount(requests[admitted], minlength=num_requests)
    return (lo + extra).to(device)


def allocate_top_k(
    confidence: torch.Tensor,
    budget: int,
    valid_len: torch.Tensor | None = None,
    *,
    min_len: int = 0,
    max_len: int | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """Production allocation (method.md §6.3): the ``budget`` best-ranked draft slots, whole tie groups only.

    ``min_len`` slots per request are sent regardless and count against the budget. A tie group that
    would overflow the budget is not admitted (the budget is never exceeded).
    """
    _check_schedule_inputs(confidence, valid_len, min_len, max_len, 0)
    if budget < 0:
        raise ValueError(f"budget must be >= 0, got {budget}")
    backend = resolve_backend(backend, confidence)
    if backend == "reference":
        from dspark.reference.scheduler import allocate_top_k as reference_allocate_top_k

        return reference_allocate_top_k(confidence, budget, valid_len, min_len=min_len, max_len=max_len)
    if backend == "triton":
        from dspark.kernels import allocate_top_k as triton_allocate_top_k

        return triton_allocate_top_k(confidence, budget, valid_len, min_len=min_len, max_len=max_len)
    device = confidence.device
    survival = survival_of(confidence)
    lo, hi = verify_length_bounds(survival, valid_len, min_len, max_len)
    room = budget - int(lo.sum())
    requests, _, group, new_group = _ranked_groups(survival, lo, hi)
    if room <= 0 or requests.numel() == 0:
        return lo.to(device)
    group_end = torch.ones_like(new_group)
    group_end[:-1] = new_group[1:]
    filled = torch.arange(1, requests.numel() + 1)
    whole_groups_fitting = int(((filled <= room) & group_end).sum())
    extra = torch.bincount(requests[group < whole_groups_fitting], minlength=survival.shape[0])
    return (lo + extra).to(device)


def fixed_length(confidence: torch.Tensor, length: int, valid_len: torch.Tensor | None = None) -> torch.Tensor:
    """Baseline: every request sends ``min(length, valid_len)`` drafts."""
    _check_schedule_inputs(confidence, valid_len, 0, None, 0)
    return _most_drafts(confidence, valid_len).clamp(max=length)


def threshold_length(confidence: torch.Tensor, threshold: float, valid_len: torch.Tensor | None = None) -> torch.Tensor:
    """Baseline (DeepSpec's threshold mode): truncate at the first slot whose conditional c_k < threshold."""
    _check_schedule_inputs(confidence, valid_len, 0, None, 0)
    passing = (confidence >= threshold).long().cumprod(-1).sum(-1)
    return passing.minimum(_most_drafts(confidence, valid_len))


def _most_drafts(confidence: torch.Tensor, valid_len: torch.Tensor | None) -> torch.Tensor:
    """``[R]`` on the confidences' device: γ, or ``valid_len`` where given. The two baselines stay on the device,
    so a decode loop that runs them waits for nothing."""
    if valid_len is None:
        return torch.full((confidence.shape[0],), confidence.shape[1], dtype=torch.long, device=confidence.device)
    return valid_len.to(device=confidence.device, dtype=torch.long)


class Scheduler:
    """A verify-length policy for the decode loop: ``policy(confidence [R, γ], valid_len [R]) → [R]``."""

    name = "scheduler"

    def __call__(self, confidence: torch.Tensor, valid_len: torch.Tensor | None = None) -> torch.Tensor:
        raise NotImplementedError

    def may_send_drafts(self, valid_len: torch.Tensor, gamma: int) -> bool:
        """Whether this round could send any draft, whatever the confidences: ``False`` lets the decode loop skip
        the drafter's forward and run a plain target step, which is what the policy would choose anyway."""
        return True


class FixedLength(Scheduler):
    def __init__(self, length: int):
        if length < 0:
            raise ValueError(f"length must be >= 0, got {length}")
        self.length = length
        self.name = f"fixed-{length}"

    def __call__(self, confidence, valid_len=None):
        return fixed_length(confidence, self.length, valid_len)

    def may_send_drafts(self, valid_len, gamma):
        return self.length > 0


class Threshold(Scheduler):
    def __init__(self, threshold: float):
        if not 0 <= threshold <= 1:
            raise ValueError(f"threshold must lie in [0, 1], got {threshold}")
        self.threshold = threshold
        self.name = f"threshold-{threshold:g}"

    def __call__(self, confidence, valid_len=None):
        return threshold_length(confidence, self.threshold, valid_len)


class PrefixScheduler(Scheduler):
    """Algorithm 1 with the early stop against a profiled SPS table (the lossless synchronous scheduler).

    ``backoff=N`` (default 0, off): after a round in which Algorithm 1 sent no draft at all, the next 1, 2,
    4, … rounds (doubling while rounds stay empty, at most N) run without drafting, and the first round that
    sends drafts again resets it. Drafting costs time even when nothing is sent, and the confidences that
    would show it pays only come from drafting. The choice rests on earlier rounds alone, and a round
    without drafts is a plain target step, so the output distribution is still the target's.
    """

    def __init__(self, sps: SPSTable, *, min_len: int = 0, max_len: int | None = None, base_tokens: int = 0,
                 backoff: int = 0):
        if backoff < 0:
            raise ValueError(f"backoff must be >= 0, got {backoff}")
        self.sps, self.min_len, self.max_len, self.base_tokens = sps, min_len, max_len, base_tokens
        self.backoff = backoff
        self.name = "algorithm-1" if not backoff else f"algorithm-1-backoff{backoff}"
        self._pause, self._rounds_to_skip = 0, 0

    def __call__(self, confidence, valid_len=None):
        lengths = schedule_greedy(confidence, self.sps, valid_len, min_len=self.min_len, max_len=self.max_len,
                                  base_tokens=self.base_tokens)
        if self.backoff:
            self._pause = 0 if bool(lengths.any()) else min(max(1, 2 * self._pause), self.backoff)
            self._rounds_to_skip = self._pause
        return lengths

    def may_send_drafts(self, valid_len, gamma):
        """``False`` while backing off (see the class), and whenever confidence 1 everywhere would send
        nothing: with no forced slots, Algorithm 1 first weighs the best candidate, whose survival is at most
        1, against the pass growing by one token, and stops there if it does not pay, so then no confidence
        can (for example where one more token costs the pass more than a whole token of throughput)."""
        if self._rounds_to_skip:
            self._rounds_to_skip -= 1
            return False
        if self.min_len > 0:
            return True
        certain = torch.ones(len(valid_len), gamma, dtype=torch.float64)
        # A question about host values, answered on the host whatever backend the round's ops use.
        return bool(schedule_greedy(certain, self.sps, valid_len.cpu(), max_len=self.max_len,
                                    base_tokens=self.base_tokens, backend="torch").any())


class ProductionScheduler(Scheduler):
    """DeepSeek-V4's variant (method.md §6.3): the budget K comes from the confidences of ``lag`` steps earlier by
    global argmax (no early stop: it cannot depend on this step's samples), then top-K over current survivals.

    Until ``lag`` steps have been seen, the budget is that of Algorithm 1 with the early stop on the
    current confidences, which is lossless on its own.

    ``smoothing=α`` sizes the budget from per-request exponential moving averages instead,
    ``m_t = α · m_{t−1} + (1 − α) · c_t`` (the approximation vLLM's adaptive verification makes): row r
    of every call must then be the same request, and a call with another number of rows starts afresh.
    The allocation always reads the current confidences.
    """

    def __init__(self, sps: SPSTable, *, lag: int = 2, smoothing: float | None = None, min_len: int = 0,
                 max_len: int | None = None):
        if lag < 1:
            raise ValueError(f"lag must be >= 1, got {lag}")
        if smoothing is not None and not 0 <= smoothing < 1:
            raise ValueError(f"smoothing must lie in [0, 1) or be None, got {smoothing}")
        self.sps, self.lag, self.smoothing, self.min_len, self.max_len = sps, lag, smoothing, min_len, max_len
        self.name = "production" if smoothing is None else f"production-ema{smoothing:g}"
        self.history: deque[torch.Tensor] = deque(maxlen=lag)
        self.average: torch.Tensor | None = None

    def budget(self, confidence: torch.Tensor, valid_len: torch.Tensor | None) -> int:
        if len(self.history) < self.lag:
            lengths = schedule_greedy(confidence, self.sps, valid_len, min_len=self.min_len, max_len=self.max_len)
        else:
            stale = self.history[0]
            lengths = schedule_greedy(stale, self.sps, None, early_stop=False, min_len=self.min_len,
                                      max_len=self.max_len)
        return int(lengths.sum())

    def __call__(self, confidence, valid_len=None):
        current = confidence.detach().cpu().double()
        if self.history and self.history[-1].shape != current.shape:
            self.history.clear()  # other requests: nothing seen so far describes them
            self.average = None
        k = self.budget(confidence, valid_len)
        if self.smoothing is not None:
            alpha = self.smoothing
            self.average = current if self.average is None else alpha * self.average + (1 - alpha) * current
            current = self.average
        self.history.append(current.clone())
        return allocate_top_k(confidence, k, valid_len, min_len=self.min_len, max_len=self.max_len)


def check_schedule_capacity(confidence: torch.Tensor, valid_len: torch.Tensor | None, min_len: int,
                            max_len: int | None, base_tokens: int, sps: SPSTable) -> None:
    """:func:`check_sps_capacity` of the tokens every schedule sends before any optional draft: the anchors, the
    base tokens and each request's forced ``min(min_len, hi_r)`` drafts. ``valid_len`` is read only when
    ``min_len`` drafts per request could overflow the table; otherwise the count cannot, and a decode loop on a GPU
    does not wait for the device to learn so."""
    num_requests = confidence.shape[0]
    if base_tokens + num_requests * (1 + min_len) <= sps.max_tokens:
        return
    lo, _ = verify_length_bounds(confidence, valid_len, min_len, max_len)
    check_sps_capacity(base_tokens + num_requests + int(lo.sum()), sps)


def check_sps_capacity(tokens: int, sps: SPSTable) -> None:
    """Refuse a verify pass whose ``tokens`` before any draft already exceed what the SPS table was profiled for."""
    if tokens > sps.max_tokens:
        raise ValueError(
            f"the verify pass needs {tokens} tokens before any draft (anchors, min_len and base tokens) but the "
            f"SPS table stops at {sps.max_tokens}: profile larger batches or lower the load"
        )


def _check_schedule_inputs(confidence, valid_len, min_len, max_len, base_tokens) -> None:
    check_tensor("confidence", confidence, ndim=2, floating=True, finite=True)
    if values_checked() and confidence.numel() and (bool((confidence < 0).any()) or bool((confidence > 1).any())):
        raise ValueError("confidence must hold probabilities in [0, 1] (apply sigmoid to the head's logits)")
    if valid_len is not None:
        check_tensor("valid_len", valid_len, shape=(confidence.shape[0],), integer=True)
        if values_checked() and valid_len.numel() and (int(valid_len.min()) < 0
                                                       or int(valid_len.max()) > confidence.shape[1]):
            raise ValueError(f"valid_len must lie in [0, {confidence.shape[1]}], got {valid_len.tolist()}")
    if min_len < 0 or (max_len is not None and max_len < min_len) or base_tokens < 0:
        raise ValueError(f"need 0 <= min_len <= max_len and base_tokens >= 0, got {min_len}, {max_len}, {base_tokens}")


def counterexample_first_token_probability(early_stop: bool, grid: int = 10) -> float:
    """P(first emitted token = A) in the paper's Appendix A counterexample, computed exactly.

    One request, γ = 2, vocabulary {A, B}; target (0.7, 0.3), draft (0.5, 0.5); c_1 = 0.8 and c_2 = 1 if the
    sampled x_1 is A, else 0 (the confidence of slot 2 reads the sampled x_1); SPS(1, 2, 3) = 1, 0.5, 0.45.
    Every uniform the round uses (two draft draws, two acceptance tests, the final draw) runs over the
    midpoints of a ``grid``-point lattice, and all the probabilities involved are multiples of 1/10, so
    the average over the lattice is the exact probability. Lossless scheduling gives 0.70 (the target's);
    the global argmax without the early stop gives 0.85.
    """
    from dspark.sampling import sample_from_probs
    from dspark.verify import verify

    sps = SPSTable(torch.tensor([1.0, 1.0, 0.5, 0.45], dtype=torch.float64))
    mid = (torch.arange(grid, dtype=torch.float64) + 0.5) / grid
    u = torch.cartesian_prod(*[mid] * 5)  # draft x1, draft x2, accept 1, accept 2, final
    n = u.shape[0]
    draft = torch.tensor([0.5, 0.5], dtype=torch.float64)
    target = torch.tensor([0.7, 0.3], dtype=torch.float64)
    tokens = torch.stack([sample_from_probs(draft.expand(n, 2), u[:, 0]),
                          sample_from_probs(draft.expand(n, 2), u[:, 1])], 1)
    lengths = {}
    for x1 in (0, 1):
        confidence = torch.tensor([[0.8, 1.0 if x1 == 0 else 0.0]], dtype=torch.float64)
        lengths[x1] = int(schedule_greedy(confidence, sps, early_stop=early_stop, backend="torch")[0])
    verify_len = torch.where(tokens[:, 0] == 0, lengths[0], lengths[1])
    out = verify(tokens, draft.expand(n, 2, 2), target.expand(n, 3, 2), verify_len, u[:, 2:4], u[:, 4],
                 backend="torch")
    return float((out.committed[:, 0] == 0).double().mean())
