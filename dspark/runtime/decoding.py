"""Decoding with a real target: plain autoregressive ``generate`` and DSpark ``speculative_generate``.

Both run the same prefill, the same sampler (:func:`dspark.sampling.warp_logits` then an inverse-CDF draw
from a seeded generator) and the same cache, so their tokens/s compare on equal footing.

One speculative round for the active requests (method.md §1):

1. ``draft``: the drafter proposes γ tokens per request from its context cache, with their draft
   distributions, confidences and survivals;
2. ``schedule``: the policy picks verify lengths ℓ_r ≤ min(γ, tokens left − 1);
3. ``verify``: the target reads ``[x_0, x_1..x_ℓ]`` in one pass, rejection sampling keeps a prefix of n drafts
   and draws one correction or bonus token (greedy decoding compares argmaxes instead, which is the same);
4. the target's cache keeps the slots of ``[x_0, x_1..x_n]`` (the rejected ones are rolled back) and the
   drafter's context cache grows by their tap features, n + 1 rows. A round that drafted nothing commits one
   token per request; its tap rows wait, and reach the drafter's cache in one call at the start of the next
   round that drafts, so a round that drafts nothing costs a plain step and its checks.
"""

from __future__ import annotations

import numbers
import time
from dataclasses import dataclass

import torch

from dspark._checks import check_sampling, trusted_values
from dspark.backend import upload
from dspark.contract import VerifyOutput
from dspark.drafter import DraftOutput
from dspark.metrics import AcceptanceStats
from dspark.runtime.graphs import StaticRound, resolve_mode
from dspark.runtime.results import GenerationResult, RequestClock, TokenBuffer
from dspark.sampling import sample_from_probs, warp_logits
from dspark.scheduler import FixedLength, Scheduler
from dspark.verify import verify, verify_greedy


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
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an int >= 1, got {self.max_new_tokens!r}")
        check_sampling(self.temperature, self.top_k, self.top_p, 1)
        if self.eos_token_id is not None and (isinstance(self.eos_token_id, bool)
                                              or not isinstance(self.eos_token_id, int) or self.eos_token_id < 0):
            raise ValueError(f"eos_token_id must be a non-negative int or None, got {self.eos_token_id!r}")


def _check_prompts(target, prompts: list[list[int]], config: SamplingConfig, extra_positions: int = 0) -> None:
    """Prompts are a non-empty list of non-empty lists of int token ids in range, and each fits the model's
    positions together with its new tokens (RoPE would run past what the model was trained on)."""
    vocab = target.vocab_size
    if not isinstance(prompts, (list, tuple)) or not prompts:
        raise ValueError(f"prompts must be a non-empty list of token-id lists, got {type(prompts).__name__} "
                         "(encode text first: target.encode_chat(text) or the tokenizer)")
    for i, p in enumerate(prompts):
        if not isinstance(p, (list, tuple)) or not p or not all(isinstance(t, numbers.Integral)
                                                                and not isinstance(t, bool) for t in p):
            raise ValueError(f"prompt {i} must be a non-empty list of int token ids, got {type(p).__name__}"
                             + (f" of {type(p[0]).__name__}" if isinstance(p, (list, tuple)) and p else ""))
        if min(p) < 0 or max(p) >= vocab:
            raise ValueError(f"prompt {i}: token ids must lie in [0, {vocab}), got [{min(p)}, {max(p)}]")
    eos = config.eos_token_id
    if eos is not None and eos >= vocab:
        raise ValueError(f"eos_token_id {eos} is outside the target's vocabulary of {vocab}")
    limit = getattr(target.config, "max_position_embeddings", None)
    longest = max(len(p) for p in prompts) + config.max_new_tokens + extra_positions
    if limit is not None and longest > limit:
        raise ValueError(f"a prompt of {max(len(p) for p in prompts)} tokens plus {config.max_new_tokens} new tokens "
                         f"(and {extra_positions} draft positions) needs {longest} positions; the model has "
                         f"{limit} (max_position_embeddings): shorten the prompt or max_new_tokens")


def prefill(target, prompts: list[list[int]]):
    """Feed right-padded prompts.

    Returns ``(state, last_logits [B, V], step, lengths [B], ids [B, L])``: ``step`` holds the taps
    ``[B, L, F]`` and final hidden states ``[B, L, H]`` of every prompt slot (padding included).
    """
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
    return state, last, step, lengths, ids


def uniform_draws(shape: tuple[int, ...], generator: torch.Generator, dtype: torch.dtype,
                  device: torch.device | str = "cpu") -> torch.Tensor:
    """Draws in ``[0, 1)`` in ``dtype`` (at least fp32): fp64 draws from ``generator``, rounded, and the few that
    round up to 1.0 (about 1 in 3·10⁷ in fp32) set to the largest value below 1 so they stay valid."""
    dtype = torch.promote_types(dtype, torch.float32)
    draws = torch.rand(shape, generator=generator, dtype=torch.float64).to(dtype)
    below_one = 1.0 - torch.finfo(dtype).eps / 2
    return upload(torch.where(draws < 1, draws, torch.full_like(draws, below_one)), device)


def sample(logits: torch.Tensor, config: SamplingConfig, generator: torch.Generator) -> torch.Tensor:
    """One token per row of ``logits [B, V]`` under the sampling config."""
    probs = warp_logits(logits, config.temperature, config.top_k, config.top_p)
    return sample_from_probs(probs, uniform_draws((logits.shape[0],), generator, probs.dtype, probs.device))


def _progress(total: int, enabled: bool, desc: str):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="tok", leave=False)


def _check_max_batch(max_batch: int | None) -> None:
    if max_batch is not None and (isinstance(max_batch, bool) or not isinstance(max_batch, numbers.Integral)
                                  or max_batch < 1):
        raise ValueError(f"max_batch must be None (every prompt in one batch) or an int >= 1, got {max_batch!r}")


def _admission_groups(pending: list[int], room: int, continuous: bool) -> list[list[int]]:
    """The prompts that join now, in prefill groups: all at once in one batch, or one by one in continuous
    batching, where a request's prefill must not depend on which requests happened to finish beside it (bf16
    prefills of several rows round each row by the others, see :mod:`dspark.runtime.invariant`)."""
    joining = pending[:room]
    return [[i] for i in joining] if continuous else [joining] if joining else []


@torch.no_grad()
def generate(target, prompts: list[list[int]], config: SamplingConfig | None = None, *,
             max_batch: int | None = None, progress: bool = False) -> GenerationResult:
    """Plain target-only decoding, one token per step per request (the baseline).

    ``max_batch=None`` decodes every prompt in one batch. ``max_batch=k`` is continuous batching: at most k
    requests run at a time, each prefilled on its own, and a request that finishes hands its place to the next
    prompt before the next step, as a serving engine keeps its batch full.
    """
    config = config or SamplingConfig()
    _check_prompts(target, prompts, config)
    _check_max_batch(max_batch)
    eos = config.eos_token_id if config.eos_token_id is not None else target.eos_token_id
    gen = torch.Generator().manual_seed(config.seed)
    bar = _progress(len(prompts) * config.max_new_tokens, progress, "target-only")
    start = time.perf_counter()
    clock = RequestClock(len(prompts), start)
    limit = len(prompts) if max_batch is None else max_batch
    prefill_s, steps = 0.0, 0
    out = TokenBuffer(len(prompts), config.max_new_tokens, eos)
    pending = list(range(len(prompts)))
    device = target.device
    state, active, token = None, torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long, device=device)
    while True:
        t0 = time.perf_counter()
        groups = _admission_groups(pending, limit - len(active), max_batch is not None)
        clock.mark("arrived", [i for group in groups for i in group])
        for group in groups:
            pending = pending[len(group):]
            joined, logits, *_ = prefill(target, [prompts[i] for i in group])
            first = sample(logits, config, gen)
            if len(active):
                target.merge(state, joined)
            else:
                state = joined
            rows = torch.tensor(group)
            active, token = torch.cat([active, rows]), torch.cat([token, first])
            out.append(rows, first[:, None], torch.ones(len(group), dtype=torch.long))
            clock.mark("first_token", group)
            if bar:
                bar.update(len(group))
        prefill_s += time.perf_counter() - t0
        done = out.finished(active)
        if bool(done.any()):
            clock.mark("finished", active[done].tolist())
            keep = (~done).nonzero().squeeze(1)
            target.select(state, keep)
            active, token = active[keep], token[keep.to(device)]
        if pending and len(active) < limit:
            continue  # places came free: fill them before the next step
        if not len(active):
            break
        step = target.forward(state, token[:, None].to(device), state.next_pos[:, None],
                              torch.ones(len(active), 1, dtype=torch.bool, device=device))
        state.next_pos = state.next_pos + 1
        token = sample(step.logits[:, -1], config, gen)
        out.append(active, token[:, None], torch.ones(len(active), dtype=torch.long))
        if bar:
            bar.update(len(active))
        steps += 1
    if bar:
        bar.close()
    seconds = time.perf_counter() - start
    return GenerationResult(out.lists(), seconds, timings={"prefill": prefill_s, "decode": seconds - prefill_s},
                            steps=steps, request_timings=clock.timings())


def _finite(t: torch.Tensor) -> torch.Tensor:
    """A 0-dim bool on ``t``'s device: every element is finite (min and max propagate NaN; an infinity is one)."""
    low, high = torch.aminmax(t)
    return torch.isfinite(low) & torch.isfinite(high)


@dataclass
class _RoundResults:
    """What the host reads back of a round, all in one copy: ``[R]`` verify lengths, accepted drafts and committed
    tokens, the ``[R, slots + 1]`` committed tokens, the ``[R, γ]`` drafted block (``None`` when nothing was
    drafted) and whether the round's logits and draft distributions were finite."""

    verify_len: torch.Tensor
    num_accepted: torch.Tensor
    num_committed: torch.Tensor
    committed: torch.Tensor
    drafted: torch.Tensor | None
    finite: bool

    @classmethod
    def read(cls, verify_len: torch.Tensor, result: VerifyOutput, finite: torch.Tensor,
             draft: DraftOutput | None) -> _RoundResults:
        num = len(result.num_accepted)
        parts = [verify_len[:, None], result.num_accepted[:, None], result.num_committed[:, None], result.committed,
                 finite.expand(num, 1).long()]
        if draft is not None:
            parts.append(draft.tokens)
        host = torch.cat(parts, 1).cpu()
        width = result.committed.shape[1]
        return cls(host[:, 0], host[:, 1], host[:, 2], host[:, 3: 3 + width],
                   host[:, 4 + width:] if draft is not None else None, bool(host[0, 3 + width]) if num else True)


class SpeculativeDecoder:
    """DSpark speculative decoding of a batch of prompts, one round per :meth:`step`; lossless for any drafter.

    Args:
        target: a :class:`dspark.runtime.target.TargetModel` whose taps match ``drafter.config.target_layer_ids``.
        drafter: a :class:`dspark.DSparkDrafter` for this target, or any drafter with the same
            ``new_cache`` / ``extend_cache`` / ``draft`` methods (the EAGLE-3-style
            :class:`dspark.eagle3.Eagle3Drafter`; without a confidence head every slot has confidence 1).
        config: sampling settings shared by drafter and target (the drafter samples from the same warp).
        scheduler: verify-length policy; default sends all γ drafts (``FixedLength(γ)``).
        backend: backend of the drafter's ops and of verification (greedy verification compares argmaxes,
            :func:`dspark.verify.verify_greedy`, in PyTorch whatever the backend).
        record_rounds: keep every round's raw confidence logits, verified and accepted counts in
            ``self.rounds`` (the data STS calibration fits, method.md §5.2).
        record_drafts: keep every drafted block in ``self.drafts`` as ``(requests [n], anchor_positions [n],
            tokens [n, γ])`` of the n requests drafted for (indices into the prompts), on the CPU: what teacher
            forcing at the same anchors can be compared with (``dspark.train.features.teacher_forced_tokens``).
        fixed_width: the target's verify pass is always γ + 1 tokens wide (positions past a request's verify
            length are fed masked and rolled back), so its shape never depends on the scheduler's choice and the
            host waits for the device once a round, for the results. What a serving engine does, and what a
            captured CUDA graph needs; on a GPU at small batch a wider pass costs little, as the target's weights
            are read once either way. Off (the default), the pass is as wide as the longest verify length, which
            the host reads first. Greedy tokens are the same either way; sampled ones are drawn from the same
            distribution, with different draws (the verifier takes γ uniforms a request instead of ℓ_max).
        graphs: ``"off"`` (the default): shapes follow the round (attention reads the longest request's context,
            the batch is as large as the running requests). ``"eager"``: static shapes (batch buckets, a context
            cache of fixed capacity, inputs copied into buffers allocated once; :mod:`dspark.runtime.graphs`),
            run op by op. ``"captured"``: the same, with the draft side (drafter forward → Markov block sampler →
            confidence) and the verifier each replayed from a CUDA graph per batch bucket; a ``ValueError``
            without a CUDA device or under ``TRITON_INTERPRET=1``. ``"auto"``: captured where it can be, else
            eager. ``graph_mode`` says which runs. Static shapes imply ``fixed_width`` and need a
            :class:`dspark.DSparkDrafter`; the context cache holds the longest prompt plus ``max_new_tokens``
            positions a request, and attention reads all of them every round. Tokens are those of ``"off"`` with
            ``fixed_width`` up to floating-point rounding (the batch and context shapes differ); captured and
            eager are equal bit for bit.

    After :meth:`start`, ``state`` is the target's decoding state and ``cache`` the drafter's context cache. The
    cache holds every committed token before the anchor whenever the drafter runs; after rounds that drafted
    nothing, their rows wait in ``waiting`` (``(taps [R, 1, F], ids [R, 1])`` per round) until it next drafts.
    """

    def __init__(self, target, drafter, config: SamplingConfig | None = None, *, scheduler: Scheduler | None = None,
                 backend: str = "auto", record_rounds: bool = False, record_drafts: bool = False,
                 fixed_width: bool = False, graphs: str = "off"):
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
        self.record_drafts = record_drafts
        self.drafts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        self.graph_mode = resolve_mode(graphs, self.device)
        if self.graph_mode != "off" and not hasattr(drafter, "new_static_cache"):
            raise ValueError(f"graphs={graphs!r} needs a DSparkDrafter, got {type(drafter).__name__}")
        self.fixed_width = fixed_width or self.graph_mode != "off"
        self.static: StaticRound | None = None

    @torch.no_grad()
    def start(self, prompts: list[list[int]], max_batch: int | None = None) -> SpeculativeDecoder:
        """Prefill the target, fill the drafter's context cache, sample the first token from the target.

        ``max_batch=None`` decodes every prompt in one batch. ``max_batch=k`` is continuous batching: at most k
        requests run at a time, each prefilled on its own, and a request that finishes hands its place to the
        next prompt at the end of its round (as :func:`generate` does with the same argument, so their tokens
        compare).
        """
        _check_prompts(self.target, prompts, self.config, self.gamma)
        _check_max_batch(max_batch)
        self.generator = torch.Generator().manual_seed(self.config.seed)
        self.stats = AcceptanceStats(self.gamma)
        self.timings = {"prefill": 0.0, "draft": 0.0, "schedule": 0.0, "target": 0.0, "verify": 0.0,
                        "bookkeeping": 0.0}
        self.steps = 0
        self.rounds_without_drafts = 0  # rounds the scheduler could not send a draft in, so nothing was drafted
        self.rounds, self.drafts = [], []  # a new decode's records only
        self.waiting: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.prompts, self.pending = list(prompts), list(range(len(prompts)))
        self.limit, self.continuous = (len(prompts), False) if max_batch is None else (max_batch, True)
        self.outputs = TokenBuffer(len(prompts), self.config.max_new_tokens, self.eos)
        self.request_rounds = torch.zeros(len(prompts), dtype=torch.long)
        self.clock = RequestClock(len(prompts), time.perf_counter())
        self.state, self.cache = None, None
        if self.graph_mode != "off":
            self._start_static(max(map(len, prompts)) + self.config.max_new_tokens)
        self.active = torch.zeros(0, dtype=torch.long)
        self.anchor = torch.zeros(0, dtype=torch.long, device=self.device)
        self._admit()
        return self

    def _start_static(self, capacity: int) -> None:
        """An empty static context cache of ``limit`` requests × ``capacity`` positions, and the static round over
        it: the previous decode's when it is as large (its captured graphs are kept), else a new one."""
        static = self.static
        if static is None or static.cache.max_batch != self.limit or static.cache.capacity < capacity:
            cache = self.drafter.new_static_cache(self.limit, capacity, device=self.device, dtype=self.dtype)
            sampling = dict(temperature=self.config.temperature, top_k=self.config.top_k, top_p=self.config.top_p)
            static = StaticRound(self.drafter, cache, self._verify, sampling, backend=self.backend,
                                 mode=self.graph_mode)
        static.cache.select(torch.zeros(0, dtype=torch.long))
        self.static, self.cache = static, static.cache

    def _admit(self) -> None:
        """Let waiting prompts join while there is room: prefill each group, fill its drafter cache, sample its
        first token, and append it to the running batch (requests that finish at once hand their place on)."""
        t0 = time.perf_counter()
        while groups := _admission_groups(self.pending, self.limit - len(self.active), self.continuous):
            self.clock.mark("arrived", [i for group in groups for i in group])
            if len(self.active):
                self._catch_up()  # waiting rows hold one row per request and round; the joining ones have none
            else:
                self.waiting = []
            for group in groups:
                self.pending = self.pending[len(group):]
                state, logits, prompt_step, lengths, ids = prefill(self.target, [self.prompts[i] for i in group])
                cache = self.drafter.new_cache(len(group), capacity=int(lengths.max()) + 16, device=self.device,
                                               dtype=self.dtype)
                self.drafter.extend_cache(cache, prompt_step.taps.to(self.dtype), lengths, token_ids=ids)
                anchor = sample(logits, self.config, self.generator).to(self.device)
                if len(self.active):
                    self.target.merge(self.state, state)
                else:
                    self.state = state
                if len(self.active) or self.static is not None:  # a static cache keeps its memory: copy in
                    self.cache.merge(cache)
                else:
                    self.cache = cache
                rows = torch.tensor(group)
                self.active, self.anchor = torch.cat([self.active, rows]), torch.cat([self.anchor, anchor])
                self.outputs.append(rows, anchor[:, None], torch.ones(len(group), dtype=torch.long))
                self.clock.mark("first_token", group)
            self._drop_finished()
        self.timings["prefill"] += time.perf_counter() - t0

    @property
    def finished(self) -> bool:
        return len(self.active) == 0 and not self.pending

    @property
    def out(self) -> list[list[int]]:
        """Tokens generated so far, per request (prompt excluded)."""
        return self.outputs.lists()

    def _drop_finished(self) -> None:
        done = self.outputs.finished(self.active)
        if bool(done.any()):
            self.clock.mark("finished", self.active[done].tolist())
            keep = (~done).nonzero().squeeze(1)
            self.target.select(self.state, keep)
            self.cache.select(keep)
            on_device = keep.to(self.device)
            self.waiting = [(taps[on_device], ids[on_device]) for taps, ids in self.waiting]
            self.active, self.anchor = self.active[keep], self.anchor[on_device]

    def _catch_up(self) -> None:
        """Extend the drafter's cache by the rows of the rounds since it last drafted (one row per request each)."""
        if self.waiting:
            taps, ids = (torch.cat(parts, 1) for parts in zip(*self.waiting))
            self.waiting = []
            counts = torch.full((taps.shape[0],), taps.shape[1], dtype=torch.long)
            self.drafter.extend_cache(self.cache, taps, counts, token_ids=ids)

    def _uniforms(self, *shape, dtype) -> torch.Tensor:
        return uniform_draws(shape, self.generator, dtype, self.device)

    @torch.no_grad()
    def step(self) -> list[int]:
        """One round for every active request; returns how many tokens each committed.

        On a GPU the host waits for the device twice a round: for the verify lengths the scheduler chose (they
        size the target's pass), and for the round's results, read back in one copy; with ``fixed_width`` only for
        the results. The public ops skip their checks of tensor values (:func:`dspark.trusted_values`): the loop
        made their inputs, and it reads back with the results whether the target's logits and the draft
        distributions were finite.
        """
        with trusted_values():
            return self._round()

    def _round(self) -> list[int]:
        config, gamma, device = self.config, self.gamma, self.device
        num = len(self.active)
        # The loop's own counts live on the host, so the scheduler learns what each request may still send for free.
        valid_len_host = torch.clamp(config.max_new_tokens - self.outputs.count[self.active] - 1, max=gamma)
        valid_len = upload(valid_len_host, device)
        t0 = time.perf_counter()
        draft = None
        if self.scheduler.may_send_drafts(valid_len_host, gamma):
            self._catch_up()
            draft = self._draft(self._uniforms(num, gamma, dtype=self.dtype))
            if self.record_drafts:
                self.drafts.append((self.active.clone(), self.state.next_pos.to("cpu", copy=True), draft.tokens.cpu()))
        else:
            self.rounds_without_drafts += 1
        t1 = time.perf_counter()
        if draft is None:
            verify_len = torch.zeros(num, dtype=torch.long, device=device)
        else:
            confidence = draft.confidence if draft.confidence is not None else torch.ones(num, gamma, device=device)
            verify_len = self.scheduler(confidence, valid_len).to(device)
        if draft is None:
            width = 1
        elif self.fixed_width:
            width = gamma + 1
        else:
            width = int(verify_len.max()) + 1  # the first read: the target's pass is as wide as the longest
        t2 = time.perf_counter()

        fed = self.anchor[:, None]
        if draft is not None:
            fed = torch.cat([fed, draft.tokens[:, : width - 1]], 1)
        positions = self.state.next_pos[:, None] + torch.arange(width, device=device)
        step = self.target.forward(self.state, fed, positions,
                                   torch.arange(width, device=device) <= verify_len[:, None])
        t_target = time.perf_counter()
        slots = max(width - 1, 1)
        draws = None if config.temperature == 0 else self._verify_draws(num, slots, step.logits.dtype)
        result, finite = self._verify_round(step.logits, draft, verify_len, slots, draws)
        # The second read: every count, token and flag the host needs of the round, in one copy.
        decided = _RoundResults.read(verify_len, result, finite, draft)
        if not decided.finite:
            raise ValueError("the target's logits or the draft distributions hold NaN or Inf values in this round")
        kept = result.num_accepted + 1  # x_0 and the accepted drafts now hold committed tokens
        longest = int(decided.num_accepted.max()) + 1
        self.target.keep(self.state, width, kept, longest=longest)
        self.state.next_pos = self.state.next_pos + kept
        if draft is None:  # every request committed its anchor alone
            self.waiting.append((step.taps[:, :1].to(self.dtype), fed[:, :1]))
        else:
            # Counts it holds on the host: the drafter's cache grows without a wait for the device.
            self.drafter.extend_cache(self.cache, step.taps[:, :longest].to(self.dtype), decided.num_accepted + 1,
                                      token_ids=fed[:, :longest])
        t3 = time.perf_counter()

        self.stats.update(decided.verify_len, decided.num_accepted, decided.num_committed, decided.drafted)
        if self.record_rounds and draft is not None and draft.confidence_logits is not None:
            # Slots after an accepted EOS were never really verified: they leave the calibration data.
            verified = torch.where(decided.num_committed == decided.num_accepted, decided.num_accepted,
                                   decided.verify_len)
            self.rounds.append((draft.confidence_logits.cpu(), verified, decided.num_accepted.clone()))
        self.outputs.append(self.active, decided.committed, decided.num_committed)
        self.request_rounds[self.active] += 1
        counts = decided.num_committed.tolist()
        # After an accepted EOS there is no next token; the request is dropped before it is read.
        self.anchor = result.next_token.clamp(min=0)
        self._drop_finished()
        t4 = time.perf_counter()
        for name, seconds in (("draft", t1 - t0), ("schedule", t2 - t1), ("target", t_target - t2),
                              ("verify", t3 - t_target), ("bookkeeping", t4 - t3)):
            self.timings[name] += seconds
        self.steps += 1
        self._admit()  # continuous batching: the places finished requests left go to waiting prompts
        return counts

    def _draft(self, draws: torch.Tensor) -> DraftOutput:
        """A block for the active requests from ``draws [R, γ]``: by the static round (eager or captured) when
        shapes are static, else by the drafter at the round's own shapes."""
        if self.static is not None:
            return self.static.draft(self.anchor, draws)
        config = self.config
        return self.drafter.draft(self.anchor, self.cache, draws, temperature=config.temperature, top_k=config.top_k,
                                  top_p=config.top_p, backend=self.backend)

    def _verify_round(self, logits: torch.Tensor, draft: DraftOutput | None, verify_len: torch.Tensor, slots: int,
                      draws: tuple[torch.Tensor, torch.Tensor] | None) -> tuple[VerifyOutput, torch.Tensor]:
        """:meth:`_verify` of this round's block, by the static round when shapes are static and a block was
        drafted (a round without one verifies a width-1 pass, which no graph holds)."""
        if self.static is not None and draft is not None:
            return self.static.verify(logits, verify_len, draws)
        return self._verify(logits, draft, verify_len, slots, draws)

    def _verify_draws(self, num: int, slots: int, logits_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """The rejection sampler's uniforms, ``[R, slots]`` and ``[R]``, in the dtype of the target's probabilities."""
        dtype = torch.promote_types(logits_dtype, torch.float32)
        return self._uniforms(num, slots, dtype=dtype), self._uniforms(num, dtype=dtype)

    def _verify(self, logits: torch.Tensor, draft: DraftOutput | None, verify_len: torch.Tensor, slots: int,
                draws: tuple[torch.Tensor, torch.Tensor] | None) -> tuple[VerifyOutput, torch.Tensor]:
        """Rejection-sample the round from the verify pass's ``logits [R, width, V]``; ``slots`` ≥ 1 drafted
        slots are handed to the verifier (with ℓ = 0 everywhere only target row 0 is read), with ``draws``
        (``None`` when greedy). Returns the verdict and a 0-dim bool on the device: whether every logit and draft
        probability it read was finite."""
        config, num, device = self.config, len(verify_len), verify_len.device
        if config.temperature == 0:  # one-hot distributions: verify_greedy returns what verify would, from argmaxes
            # max propagates NaN and finds +inf, so finite maxima mean every argmax is a real token.
            top, target_tokens = logits.max(-1)
            if target_tokens.shape[1] < slots + 1:
                target_tokens = torch.cat([target_tokens, target_tokens[:, -1:]], 1)
            tokens = torch.zeros(num, slots, dtype=torch.long, device=device) if draft is None \
                else draft.tokens[:, :slots]
            return verify_greedy(tokens, target_tokens, verify_len, eos_token_id=self.eos), _finite(top)
        finite = _finite(logits)
        target_probs = warp_logits(logits, config.temperature, config.top_k, config.top_p)
        if target_probs.shape[1] < slots + 1:
            target_probs = torch.cat([target_probs, target_probs[:, -1:]], 1)
        dtype = target_probs.dtype
        if draft is None:  # a plain target step: with ℓ = 0 the draft slot is never read, only its shape
            tokens, draft_probs = torch.zeros(num, slots, dtype=torch.long, device=device), target_probs[:, :slots]
        else:
            tokens, draft_probs = draft.tokens[:, :slots], draft.draft_probs[:, :slots].to(dtype)
            finite = finite & _finite(draft_probs)
        return verify(tokens, draft_probs, target_probs, verify_len, *draws, eos_token_id=self.eos,
                      backend=self.backend), finite

    def run(self, progress: bool = False) -> GenerationResult:
        """Step until every request has finished; the result's time includes the prefill."""
        bar = _progress(len(self.outputs.count) * self.config.max_new_tokens, progress, "speculative")
        if bar:
            bar.update(int(self.outputs.count.sum()))
        t0 = time.perf_counter() - self.timings["prefill"]
        while not self.finished:
            self.step()
            if bar:  # the round's tokens and the first tokens of requests that joined after it
                bar.update(int(self.outputs.count.sum()) - bar.n)
        if bar:
            bar.close()
        return GenerationResult(self.outputs.lists(), time.perf_counter() - t0, self.stats, self.timings, self.steps,
                                self.rounds_without_drafts, self.request_rounds.tolist(), self.clock.timings())


def speculative_generate(target, drafter, prompts: list[list[int]], config: SamplingConfig | None = None, *,
                         scheduler: Scheduler | None = None, backend: str = "auto", max_batch: int | None = None,
                         progress: bool = False) -> GenerationResult:
    """Decode ``prompts`` with DSpark speculative decoding; see :class:`SpeculativeDecoder` (``max_batch``: see
    :meth:`SpeculativeDecoder.start`)."""
    decoder = SpeculativeDecoder(target, drafter, config, scheduler=scheduler, backend=backend)
    return decoder.start(prompts, max_batch).run(progress)
