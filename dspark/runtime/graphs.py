"""Static shapes and CUDA graphs for the draft side of a decode round and for its rejection sampler.

At batch 1 a round's kernels do microseconds of work each, and on a GPU the host spends longer issuing them
than the device spends running them. A serving engine records such a sequence once as a CUDA graph and then
launches it whole. That needs every shape and every address the sequence touches to stay put between rounds,
so :class:`StaticRound` keeps them fixed:

* requests run in **batch buckets** (1, 2, 4, … up to ``max_batch``): a round of ``R`` requests runs the
  smallest bucket ``b ≥ R``, rows ``R … b−1`` being padding whose results are dropped;
* the drafter's context cache is a :class:`dspark.backbone.StaticContextCache` of ``max_batch`` requests ×
  ``capacity`` positions, and attention reads all ``capacity`` rows of it (masked past each request's length)
  instead of the longest request's;
* the round's inputs (anchors, context lengths, uniform draws, the target's logits, the verify lengths) are
  copied into buffers allocated once, and each bucket's outputs are the tensors its graph wrote at capture.

Two functions of those buffers run per round: ``draft`` (drafter forward → Markov block sampler → confidence)
and ``verify`` (the rejection sampler, or the greedy comparison at temperature 0). The scheduler and the target
run between them as they are (a policy may read values on the host; the target is the user's model). Modes:

* ``"eager"``: the static shapes, run op by op. What a CPU and the Triton interpreter run, and the path to
  debug with: it is the captured path's code without the capture.
* ``"captured"``: each function is captured as one CUDA graph per bucket, the first time the bucket is used
  (after warm-up calls that compile the kernels), and replayed after. Asking for it without a CUDA device or
  under ``TRITON_INTERPRET=1`` is a ``ValueError``; it never falls back to eager on its own.

Padding rows hold earlier requests' values (or zeros): valid inputs, so every row computes something finite.
"""

from __future__ import annotations

import dataclasses

import torch

from dspark.backbone import ContextCache, StaticContextCache
from dspark.drafter import DraftOutput

MODES = ("off", "eager", "captured", "auto")
# Calls before a capture: the first compiles the Triton kernels and builds the launch plans, the second runs
# them as the capture will (PyTorch's CUDA graph notes ask for warm-up on a side stream).
WARMUP_CALLS = 2


def resolve_mode(mode: str, device: torch.device) -> str:
    """The mode that runs: ``"auto"`` is ``"captured"`` where a capture can run (a CUDA device, compiled kernels),
    ``"eager"`` elsewhere; ``"captured"`` where it cannot is a ``ValueError``."""
    if mode not in MODES:
        raise ValueError(f"graphs must be one of {MODES}, got {mode!r}")
    from dspark.kernels._tuning import interpreting

    capturable = torch.device(device).type == "cuda" and not interpreting()
    if mode == "auto":
        return "captured" if capturable else "eager"
    if mode == "captured" and not capturable:
        why = "TRITON_INTERPRET=1 runs the kernels in Python" if interpreting() else f"the device is {device}"
        raise ValueError(f"graphs='captured' needs a CUDA device with compiled kernels, but {why}; "
                         "graphs='eager' runs the same static shapes without a capture")
    return mode


def batch_buckets(max_batch: int) -> tuple[int, ...]:
    """``(1, 2, 4, …, max_batch)``: the powers of two below ``max_batch``, then ``max_batch`` itself."""
    if max_batch < 1:
        raise ValueError(f"max_batch must be >= 1, got {max_batch}")
    buckets = [1 << i for i in range(max_batch.bit_length()) if 1 << i < max_batch]
    return (*buckets, max_batch)


def _first_rows(outputs, num: int):
    """A dataclass of per-request tensors (``None`` kept), cut to its first ``num`` rows."""
    return type(outputs)(**{f.name: None if getattr(outputs, f.name) is None else getattr(outputs, f.name)[:num]
                            for f in dataclasses.fields(outputs)})


class _BucketRunner:
    """``fn(bucket)``, a function of static buffers, run eagerly or replayed from one CUDA graph per bucket."""

    def __init__(self, fn, capture: bool, pool):
        self.fn, self.capture, self.pool = fn, capture, pool
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, object]] = {}

    def __call__(self, bucket: int):
        if not self.capture:
            return self.fn(bucket)
        if bucket not in self.graphs:
            self.graphs[bucket] = self._capture(bucket)
        graph, outputs = self.graphs[bucket]
        graph.replay()
        return outputs

    def _capture(self, bucket: int):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(WARMUP_CALLS):
                self.fn(bucket)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            outputs = self.fn(bucket)
        return graph, outputs


class StaticRound:
    """The draft side and the verifier of a decode round at static shapes, eager or captured; see the module.

    Args:
        drafter: a :class:`dspark.DSparkDrafter`.
        cache: the :class:`dspark.backbone.StaticContextCache` the decode loop keeps its requests in.
        verifier: ``verifier(logits [b, γ+1, V], draft, verify_len [b], slots, draws) → (VerifyOutput, finite)``,
            the decode loop's verification (rejection sampling, or greedy comparison when ``draws`` is ``None``).
        sampling: ``dict(temperature=, top_k=, top_p=)`` of the drafter's sampler.
        mode: ``"eager"`` or ``"captured"`` (resolve ``"auto"`` with :func:`resolve_mode` first).

    ``captures`` counts the graphs captured so far (two per bucket used: draft and verify).
    """

    def __init__(self, drafter, cache: StaticContextCache, verifier, sampling: dict, *, backend: str, mode: str):
        if mode not in ("eager", "captured"):
            raise ValueError(f"mode must be 'eager' or 'captured', got {mode!r}")
        self.drafter, self.cache, self.verifier = drafter, cache, verifier
        self.sampling, self.backend, self.mode = sampling, backend, mode
        self.gamma = drafter.config.block_size
        self.buckets = batch_buckets(cache.max_batch)
        device, rows = cache.lengths.device, cache.max_batch
        draw_dtype = torch.promote_types(next(drafter.parameters()).dtype, torch.float32)
        self.anchor = torch.zeros(rows, dtype=torch.long, device=device)
        self.lengths = torch.zeros(rows, dtype=torch.long, device=device)
        self.draft_draws = torch.zeros(rows, self.gamma, dtype=draw_dtype, device=device)
        self.verify_len = torch.zeros(rows, dtype=torch.long, device=device)
        # Shaped by the target's first logits (their vocabulary and dtype), before the first verify capture.
        self.logits: torch.Tensor | None = None
        self.slot_draws: torch.Tensor | None = None
        self.extra_draws: torch.Tensor | None = None
        self._drafts: dict[int, DraftOutput] = {}
        capture = mode == "captured"
        pool = torch.cuda.graph_pool_handle() if capture else None
        # One pool for every graph: a round replays only its bucket's draft graph then its verify graph, and the
        # verify graph was captured after the draft graph whose outputs it reads, with those outputs alive, so
        # no graph's memory holds what a later replay in the same round still needs.
        self._draft = _BucketRunner(self._draft_bucket, capture, pool)
        self._verify = _BucketRunner(self._verify_bucket, capture, pool)

    @property
    def captures(self) -> int:
        return len(self._draft.graphs) + len(self._verify.graphs)

    def bucket(self, num: int) -> int:
        """The smallest bucket that holds ``num`` requests."""
        for size in self.buckets:
            if size >= num:
                return size
        raise ValueError(f"{num} requests exceed the largest batch bucket, {self.buckets[-1]}")

    def draft(self, anchor: torch.Tensor, draws: torch.Tensor) -> DraftOutput:
        """Draft one block for the cache's ``R`` requests: ``anchor [R]``, ``draws [R, γ]`` on the device.
        Returns the first ``R`` rows of the bucket's outputs (views: valid until the next round)."""
        num = len(anchor)
        bucket = self.bucket(num)
        self.anchor[:num] = anchor
        self.lengths[:num] = self.cache.lengths
        self.draft_draws[:num] = draws
        out = self._draft(bucket)
        self._drafts[bucket] = out
        return _first_rows(out, num)

    def verify(self, logits: torch.Tensor, verify_len: torch.Tensor, draws: tuple[torch.Tensor, torch.Tensor] | None):
        """Verify the block :meth:`draft` drafted this round against the target's ``logits [R, γ+1, V]``;
        ``draws``: ``([R, γ], [R])`` uniforms, or ``None`` when greedy. Returns the verdict's first ``R`` rows
        and the finiteness flag."""
        num = len(verify_len)
        if self.logits is None:
            self._shape_verify_buffers(logits)
        self.logits[:num] = logits
        self.verify_len[:num] = verify_len
        if draws is not None:
            self.slot_draws[:num], self.extra_draws[:num] = draws
        result, finite = self._verify(self.bucket(num))
        return _first_rows(result, num), finite

    def _shape_verify_buffers(self, logits: torch.Tensor) -> None:
        rows = self.cache.max_batch
        self.logits = logits.new_zeros(rows, *logits.shape[1:])
        dtype = torch.promote_types(logits.dtype, torch.float32)
        self.slot_draws = torch.zeros(rows, self.gamma, dtype=dtype, device=logits.device)
        self.extra_draws = torch.zeros(rows, dtype=dtype, device=logits.device)

    def _draft_bucket(self, bucket: int) -> DraftOutput:
        cache = self.cache
        view = ContextCache(keys=[k[:bucket] for k in cache.key_storage],
                            values=[v[:bucket] for v in cache.value_storage], lengths=self.lengths[:bucket])
        return self.drafter.draft(self.anchor[:bucket], view, self.draft_draws[:bucket], backend=self.backend,
                                  context_rows=cache.capacity, **self.sampling)

    def _verify_bucket(self, bucket: int):
        draft = self._drafts[bucket]
        greedy = self.sampling["temperature"] == 0
        draws = None if greedy else (self.slot_draws[:bucket], self.extra_draws[:bucket])
        return self.verifier(self.logits[:bucket], draft, self.verify_len[:bucket], self.gamma, draws)
