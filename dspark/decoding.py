"""Decoding with a real target: plain autoregressive ``generate`` and DSpark ``speculative_generate``.

Both run the same prefill, the same sampler (:func:`dspark.sampling.warp_logits` then an inverse-CDF draw
from a seeded generator) and the same cache, so their tokens/s compare on equal footing.

One speculative round for the active requests (SPEC §1):

1. ``draft``: the drafter proposes γ tokens per request from its context cache, with their draft
   distributions, confidences and survivals;
2. ``schedule``: the policy picks verify lengths ℓ_r ≤ min(γ, tokens left − 1);
3. ``verify``: the target reads ``[x_0, x_1..x_ℓ]`` in one pass, rejection sampling keeps a prefix of n drafts
   and draws one correction or bonus token;
4. the target's cache keeps the slots of ``[x_0, x_1..x_n]`` (the rejected ones are rolled back) and the
   drafter's context cache grows by their tap features, n + 1 rows.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from dspark.metrics import AcceptanceStats
from dspark.sampling import sample_from_probs, warp_logits
from dspark.scheduler import FixedLength, Scheduler
from dspark.verify import verify


@dataclass
class SamplingConfig:
    """``temperature=0`` is greedy. ``eos_token_id=None`` takes the target's."""

    max_new_tokens: int = 64
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int = 0
    eos_token_id: int | None = None

    def __post_init__(self):
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")


@dataclass
class GenerationResult:
    """Generated token ids per request (prompt excluded), acceptance statistics and where the time went."""

    tokens: list[list[int]]
    seconds: float
    stats: AcceptanceStats | None = None
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def new_tokens(self) -> int:
        return sum(len(t) for t in self.tokens)

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else float("nan")

    def table(self) -> str:
        """τ, acceptance by position (conditional and unconditional), tokens/s and the time split."""
        from dspark.report import format_table

        row = {"tokens": self.new_tokens, "tps": self.tokens_per_second, **{k: v for k, v in self.timings.items()}}
        columns = [("tokens", "new tokens"), ("tps", "tokens/s")]
        if self.stats is not None:
            row.update(tau=self.stats.tau, cond=self.stats.conditional.tolist(),
                       uncond=self.stats.unconditional.tolist())
            columns += [("tau", "τ"), ("cond", "acceptance | prefix accepted"), ("uncond", "acceptance, unconditional")]
        columns += [(k, f"{k} s") for k in self.timings]
        return format_table([row], columns)

    def summary(self) -> dict:
        out = {"new_tokens": self.new_tokens, "seconds": self.seconds, "tokens_per_second": self.tokens_per_second,
               "timings": dict(self.timings)}
        if self.stats is not None:
            out.update(self.stats.as_dict())
        return out


def _check_prompts(prompts: list[list[int]], vocab: int) -> None:
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("need at least one prompt, each with at least one token")
    for p in prompts:
        if min(p) < 0 or max(p) >= vocab:
            raise ValueError(f"prompt token ids must lie in [0, {vocab})")


def prefill(target, prompts: list[list[int]]):
    """Feed right-padded prompts. Returns ``(state, last_logits [B, V], taps [B, L, F], lengths [B], ids [B, L])``."""
    device = target.device
    lengths = torch.tensor([len(p) for p in prompts], device=device)
    width = int(lengths.max())
    ids = torch.zeros(len(prompts), width, dtype=torch.long, device=device)
    for i, p in enumerate(prompts):
        ids[i, : len(p)] = torch.tensor(p, device=device)
    slots = torch.arange(width, device=device).expand(len(prompts), width)
    valid = slots < lengths[:, None]
    state = target.new_state(len(prompts))
    step = target.forward(state, ids, slots, valid)
    state.next_pos = lengths.clone()
    last = step.logits[torch.arange(len(prompts), device=device), lengths - 1]
    return state, last, step.taps, lengths, ids


def sample(logits: torch.Tensor, config: SamplingConfig, generator: torch.Generator) -> torch.Tensor:
    """One token per row of ``logits [B, V]`` under the sampling config."""
    probs = warp_logits(logits, config.temperature, config.top_k, config.top_p)
    uniforms = torch.rand(logits.shape[0], generator=generator, dtype=torch.float64).to(probs)
    return sample_from_probs(probs, uniforms)


def _finished(out: list[list[int]], active: torch.Tensor, eos: int | None, max_new_tokens: int) -> torch.Tensor:
    """``[len(active)]`` bool: the request's last token is EOS, or it has all its tokens."""
    return torch.tensor([(eos is not None and out[r][-1] == eos) or len(out[r]) >= max_new_tokens
                         for r in active.tolist()], dtype=torch.bool)


def _progress(total: int, enabled: bool, desc: str):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="tok", leave=False)


@torch.no_grad()
def generate(target, prompts: list[list[int]], config: SamplingConfig | None = None, *,
             progress: bool = False) -> GenerationResult:
    """Plain target-only decoding, one token per step per request (the baseline)."""
    config = config or SamplingConfig()
    _check_prompts(prompts, target.vocab_size)
    eos = config.eos_token_id if config.eos_token_id is not None else target.eos_token_id
    gen = torch.Generator().manual_seed(config.seed)
    bar = _progress(len(prompts) * config.max_new_tokens, progress, "target-only")
    start = time.perf_counter()
    state, logits, *_ = prefill(target, prompts)
    out: list[list[int]] = [[] for _ in prompts]
    active = torch.arange(len(prompts))
    token = sample(logits, config, gen)
    while True:
        for row, req in enumerate(active.tolist()):
            out[req].append(int(token[row]))
        if bar:
            bar.update(len(active))
        done = _finished(out, active, eos, config.max_new_tokens)
        if bool(done.all()):
            break
        if bool(done.any()):
            keep = (~done).nonzero().squeeze(1)
            target.select(state, keep)
            active, token = active[keep], token[keep.to(token.device)]
        device = target.device
        step = target.forward(state, token[:, None].to(device), state.next_pos[:, None],
                              torch.ones(len(active), 1, dtype=torch.bool, device=device))
        state.next_pos = state.next_pos + 1
        token = sample(step.logits[:, -1], config, gen)
    if bar:
        bar.close()
    return GenerationResult(out, time.perf_counter() - start)


class SpeculativeDecoder:
    """DSpark speculative decoding of a batch of prompts, one round per :meth:`step`; lossless for any drafter.

    Args:
        target: a :class:`dspark.target.TargetModel` whose taps match ``drafter.config.target_layer_ids``.
        drafter: a :class:`dspark.DSparkDrafter` for this target, or any drafter with the same
            ``new_cache`` / ``extend_cache`` / ``draft`` methods (the EAGLE-3-style
            :class:`dspark.eagle3.Eagle3Drafter`; without a confidence head every slot has confidence 1).
        config: sampling settings shared by drafter and target (the drafter samples from the same warp).
        scheduler: verify-length policy; default sends all γ drafts (``FixedLength(γ)``).
        backend: backend of the drafter's ops and of verification.
        record_rounds: keep every round's raw confidence logits, verified and accepted counts in
            ``self.rounds`` (the data STS calibration fits, SPEC §4.3).
    """

    def __init__(self, target, drafter, config: SamplingConfig | None = None, *, scheduler: Scheduler | None = None,
                 backend: str = "auto", record_rounds: bool = False):
        self.config = config or SamplingConfig()
        dcfg = drafter.config
        if list(dcfg.target_layer_ids) != list(target.tap_layers):
            raise ValueError(f"drafter taps {dcfg.target_layer_ids} differ from the target's {target.tap_layers}")
        if dcfg.vocab_size != target.vocab_size:
            raise ValueError(f"drafter vocabulary {dcfg.vocab_size} must equal the target's {target.vocab_size}")
        self.target, self.drafter, self.backend = target, drafter, backend
        self.gamma = dcfg.block_size
        self.scheduler = scheduler or FixedLength(self.gamma)
        self.eos = self.config.eos_token_id if self.config.eos_token_id is not None else target.eos_token_id
        self.dtype = next(drafter.parameters()).dtype
        self.device = target.device
        self.record_rounds = record_rounds
        self.rounds: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []

    @torch.no_grad()
    def start(self, prompts: list[list[int]]) -> SpeculativeDecoder:
        """Prefill the target, fill the drafter's context cache, sample the first token from the target."""
        _check_prompts(prompts, self.target.vocab_size)
        self.generator = torch.Generator().manual_seed(self.config.seed)
        self.stats = AcceptanceStats(self.gamma)
        self.timings = {"prefill": 0.0, "draft": 0.0, "schedule": 0.0, "verify": 0.0}
        t0 = time.perf_counter()
        self.state, logits, taps, lengths, ids = prefill(self.target, prompts)
        self.cache = self.drafter.new_cache(len(prompts), capacity=int(lengths.max()) + 16, device=self.device,
                                            dtype=self.dtype)
        self.drafter.extend_cache(self.cache, taps.to(self.dtype), lengths, token_ids=ids)
        self.anchor = sample(logits, self.config, self.generator).to(self.device)
        self.out: list[list[int]] = [[int(t)] for t in self.anchor.tolist()]
        self.active = torch.arange(len(prompts))
        self.timings["prefill"] = time.perf_counter() - t0
        self._drop_finished()
        return self

    @property
    def finished(self) -> bool:
        return len(self.active) == 0

    def _drop_finished(self) -> None:
        done = _finished(self.out, self.active, self.eos, self.config.max_new_tokens)
        if bool(done.any()):
            keep = (~done).nonzero().squeeze(1)
            self.target.select(self.state, keep)
            self.cache.select(keep)
            self.active, self.anchor = self.active[keep], self.anchor[keep.to(self.device)]

    def _uniforms(self, *shape, dtype) -> torch.Tensor:
        return torch.rand(*shape, generator=self.generator, dtype=torch.float64).to(self.device, dtype)

    @torch.no_grad()
    def step(self) -> list[int]:
        """One round for every active request; returns how many tokens each committed."""
        config, gamma, device = self.config, self.gamma, self.device
        num = len(self.active)
        remaining = torch.tensor([config.max_new_tokens - len(self.out[r]) for r in self.active.tolist()],
                                 device=device)
        t0 = time.perf_counter()
        draft = self.drafter.draft(self.anchor, self.cache, self._uniforms(num, gamma, dtype=self.dtype),
                                   temperature=config.temperature, top_k=config.top_k, top_p=config.top_p,
                                   backend=self.backend)
        t1 = time.perf_counter()
        valid_len = torch.clamp(remaining - 1, max=gamma)
        confidence = draft.confidence if draft.confidence is not None else torch.ones(num, gamma, device=device)
        verify_len = self.scheduler(confidence, valid_len).to(device)
        t2 = time.perf_counter()

        width = int(verify_len.max()) + 1
        fed = torch.cat([self.anchor[:, None], draft.tokens[:, : width - 1]], 1)
        positions = self.state.next_pos[:, None] + torch.arange(width, device=device)
        step = self.target.forward(self.state, fed, positions,
                                   torch.arange(width, device=device) <= verify_len[:, None])
        target_probs = warp_logits(step.logits, config.temperature, config.top_k, config.top_p)
        slots = max(width - 1, 1)  # verify needs one slot at least; with ℓ = 0 everywhere only row 0 is read
        if target_probs.shape[1] < slots + 1:
            target_probs = torch.cat([target_probs, target_probs[:, -1:]], 1)
        dtype = target_probs.dtype
        result = verify(draft.tokens[:, :slots], draft.draft_probs[:, :slots].to(dtype), target_probs, verify_len,
                        self._uniforms(num, slots, dtype=dtype), self._uniforms(num, dtype=dtype),
                        eos_token_id=self.eos, backend=self.backend)
        kept = result.num_accepted + 1  # x_0 and the accepted drafts now hold committed tokens
        self.target.keep(self.state, width, kept)
        self.state.next_pos = self.state.next_pos + kept
        self.drafter.extend_cache(self.cache, step.taps[:, : int(kept.max())].to(self.dtype), kept,
                                  token_ids=fed[:, : int(kept.max())])
        t3 = time.perf_counter()
        self.timings["draft"] += t1 - t0
        self.timings["schedule"] += t2 - t1
        self.timings["verify"] += t3 - t2

        self.stats.update(verify_len.cpu(), result.num_accepted.cpu(), result.num_committed.cpu())
        if self.record_rounds and draft.confidence_logits is not None:
            # Slots after an accepted EOS were never really verified: they leave the calibration data.
            verified = torch.where(result.num_committed == result.num_accepted, result.num_accepted, verify_len)
            self.rounds.append((draft.confidence_logits.cpu(), verified.cpu(), result.num_accepted.cpu()))
        committed = result.committed.cpu()
        counts = []
        for row, req in enumerate(self.active.tolist()):
            new = [int(t) for t in committed[row, : int(result.num_committed[row])]]
            self.out[req].extend(new)
            counts.append(len(new))
        # After an accepted EOS there is no next token; the request is dropped before it is read.
        self.anchor = result.next_token.clamp(min=0)
        self._drop_finished()
        return counts

    def run(self, progress: bool = False) -> GenerationResult:
        """Step until every request has finished; the result's time includes the prefill."""
        bar = _progress(len(self.out) * self.config.max_new_tokens, progress, "speculative")
        if bar:
            bar.update(len(self.out))
        t0 = time.perf_counter() - self.timings["prefill"]
        while not self.finished:
            counts = self.step()
            if bar:
                bar.update(sum(counts))
        if bar:
            bar.close()
        return GenerationResult(self.out, time.perf_counter() - t0, self.stats, self.timings)


def speculative_generate(target, drafter, prompts: list[list[int]], config: SamplingConfig | None = None, *,
                         scheduler: Scheduler | None = None, backend: str = "auto",
                         progress: bool = False) -> GenerationResult:
    """Decode ``prompts`` with DSpark speculative decoding; see :class:`SpeculativeDecoder`."""
    decoder = SpeculativeDecoder(target, drafter, config, scheduler=scheduler, backend=backend)
    return decoder.start(prompts).run(progress)
