"""Linear layers laid out for the few rows a decoding step feeds.

A decoding step feeds one token per request, a verify pass a handful. On CPUs, ``F.linear(x, W)`` with a
single row of ``x`` runs as a matrix-vector product that streams ``W`` once, but with 2 to 64 rows it runs as
a GEMM that, going by the timings below, pays for repacking ``W`` on every call, so feeding two tokens to a
target cost far more than feeding one. Computed as ``(W · xᵀ)ᵀ``, the same product hands BLAS ``W`` as the
tall left operand and the few rows as a narrow right one, a shape it streams ``W`` through once.
``benchmarks/bench_sps.py`` times the layouts, pass by pass: on a 2-core AMD EPYC with MKL
(``sps_cpu.json``), a pass of the SmolLM2-135M target over 2 / 4 / 8 tokens cost 1.61 / 1.65 / 1.85
one-token passes with ``F.linear`` and 0.87 / 0.80 / 1.36 in this layout. That is the verify pass's cost,
and so what speculative decoding can gain, on CPUs.

Which layout is faster depends on the CPU and its BLAS, though: on a 2-core Intel Xeon with AMX
(``sps_cpu_xeon.json``), ``F.linear`` runs passes of 1 to 4 tokens faster than this layout, and neither
comes near a one-token pass at 8 tokens. So the layout is a process-wide setting
(:func:`set_skinny_rows`, :func:`few_row_layout`), and :func:`dspark.runtime.profiling.choose_few_row_layout` times the
target's verify pass in each layout at start-up and keeps the fastest.

A third layout hands the repacking to the library once: ``"packed"`` keeps, per weight, a copy laid out for the
GEMM kernel, so no call repacks ``W`` (``bench_sps.py`` times it as ``packed``). For fp32 weights that is MKL's
``sgemm_pack``, multiplied against with ``sgemm_compute``; each copy is sized for a bucket of rows (4, 8, 16, 32
or 64: the input is padded with zero rows up to its bucket, the use MKL documents) and costs the weight's memory
again per bucket used. Single rows stay matrix-vector products, and on some CPUs MKL multiplies 2 or 3 rows
without repacking too, so the setting also says from how many rows the layout starts (``min_rows``). For bf16
weights it is oneDNN's blocked layout, one copy for any number of rows, single rows included: on CPUs with AMX a
bf16 pass of 1 to 8 tokens then costs little more than one token (``sps_cpu_xeon.json``). On such a Xeon oneDNN
multiplies the packed copy exactly as ``F.linear`` multiplies the weight, so this layout changes speed and not one
bit of the results; on other CPUs the two kernels may round some shapes' products apart by a last bit. Copies are
dropped with the weight or by :func:`clear_packed_weights`; an in-place change to the weight (an optimiser step,
``load_state_dict``) makes them repack. The layout needs a torch built with MKL for fp32 or with oneDNN for bf16
(:func:`packed_layout_available`: x86 CPU wheels have both) and inputs that need no gradient; others take
``F.linear``.

bf16 inputs never take ``(W · xᵀ)ᵀ``: in bf16 the few-row products are ``F.linear`` or the packed copy, cut into
calls that :func:`bf16_call_rows` measured to keep rows apart, so that each row comes out as it would alone,
whatever else shares the pass (what :mod:`dspark.runtime.invariant` builds on). ``Linear`` is ``nn.Linear`` with these
layouts on CPU inputs of at most :func:`skinny_rows` rows; it has the same parameters and state-dict keys, so
checkpoints and exports do not see it. On GPUs, and for longer inputs (prefill, training batches), it is
``F.linear``. All layouts compute the same dot products; results agree to the dtype's rounding, not bitwise,
because the products accumulate in another order. Within a layout, bf16 rows never depend on their batch-mates.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.weak import WeakIdKeyDictionary

SKINNY_ROWS = 64
"""The default setting: inputs with at most this many rows take the few-row layout on CPU. On the AMD EPYC the
``(W · xᵀ)ᵀ`` layout made the whole target forward faster at every width measured from 2 to 64 tokens;
single products of 150 rows (a prefill) timed about even in the two layouts, so longer inputs keep
``F.linear``."""

LAYOUTS = ("transposed", "packed")
"""The few-row layouts: ``(W · xᵀ)ᵀ``, and weights packed for MKL (fp32) or oneDNN (bf16); see the module
docstring."""

PACKED_BUCKETS = (4, 8, 16, 32, 64)

BF16_INVARIANT_ROWS = 32
"""The most rows a few-row bf16 product ever hands oneDNN in one call (:func:`bf16_call_rows` may allow fewer). On
a Xeon with AMX, up to 32 rows oneDNN gives each row what it gives that row alone, for most weight shapes and all
of SmolLM2-135M's; from 33 rows (54 for 576 × 576 weights) it switches kernels and rows change by rounding."""

_skinny_rows = SKINNY_ROWS
_layout = "transposed"
_min_rows = 1
_ONEDNN = "onednn"  # the key of a bf16 weight's one oneDNN copy, beside fp32 weights' MKL buckets
_packed: WeakIdKeyDictionary = WeakIdKeyDictionary()  # weight -> {bucket or _ONEDNN: (version, data_ptr, copy)}


def skinny_rows() -> int:
    """The most rows a CPU input may have to take the few-row layout now (0: it is off, all is ``F.linear``)."""
    return _skinny_rows


def skinny_layout() -> str:
    """Which few-row layout CPU inputs of :func:`skinny_min_rows` … :func:`skinny_rows` rows take now: one of
    :data:`LAYOUTS`."""
    return _layout


def skinny_min_rows() -> int:
    """The fewest rows a CPU input must have to take the few-row layout now (fewer take ``F.linear``)."""
    return _min_rows


def describe_layout(dtype: torch.dtype | None = None) -> str:
    """The current setting in words, for reports; ``dtype`` (the model's) narrows it to what that dtype takes."""
    if _skinny_rows == 0:
        return "F.linear"

    def span(first: int) -> str:
        return f"up to {_skinny_rows} rows" if first == 1 else f"{first} to {_skinny_rows} rows"

    chunks = f"in calls of up to {BF16_INVARIANT_ROWS} rows"
    if _layout == "transposed":
        transposed, bf16 = f"(W·xᵀ)ᵀ for {span(_min_rows)}", f"bf16 F.linear {chunks} for {span(_min_rows)}"
        return {torch.float32: transposed, torch.bfloat16: bf16}.get(dtype, f"{transposed}, {bf16}")
    mkl = f"MKL-packed fp32 weights for {span(max(_min_rows, 2))}"
    onednn = f"oneDNN-packed bf16 weights {chunks} for {span(_min_rows)}"
    return {torch.float32: mkl, torch.bfloat16: onednn}.get(dtype, f"{mkl}, {onednn}")


@functools.cache
def packed_layout_available(dtype: torch.dtype = torch.float32) -> bool:
    """Whether this torch can pack ``dtype`` weights for the ``"packed"`` layout: fp32 needs MKL's packed GEMM,
    bf16 needs oneDNN with bf16 support on this CPU; other dtypes have no packed form."""
    if dtype == torch.float32:
        return torch.backends.mkl.is_available() and hasattr(torch.ops.mkl, "_mkl_linear")
    if dtype == torch.bfloat16:
        return torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    return False


def set_skinny_rows(rows: int, layout: str = "transposed", min_rows: int = 1) -> None:
    """Let CPU inputs of ``min_rows`` … ``rows`` rows take ``layout`` from now on, and all others ``F.linear``
    (``rows`` 0 turns few-row layouts off). The packed layout leaves single rows to ``F.linear`` whatever
    ``min_rows`` says: one row is a matrix-vector product, which reads ``W`` once already."""
    global _skinny_rows, _layout, _min_rows
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 0:
        raise ValueError(f"rows must be an int >= 0, got {rows!r}")
    if isinstance(min_rows, bool) or not isinstance(min_rows, int) or min_rows < 1:
        raise ValueError(f"min_rows must be an int >= 1, got {min_rows!r}")
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if layout == "packed" and rows > PACKED_BUCKETS[-1]:
        raise ValueError(f"the packed layout takes at most {PACKED_BUCKETS[-1]} rows, got {rows}")
    if layout == "packed" and not (packed_layout_available(torch.float32) or packed_layout_available(torch.bfloat16)):
        raise ValueError("the packed layout needs a torch built with MKL (fp32) or oneDNN with bf16 support on this "
                         "CPU (bf16); neither is available here")
    _skinny_rows, _layout, _min_rows = rows, layout, min_rows


@contextlib.contextmanager
def few_row_layout(rows: int, layout: str = "transposed", min_rows: int = 1) -> Iterator[None]:
    """Run the block with :func:`set_skinny_rows` at these arguments, then restore the previous setting."""
    saved = _skinny_rows, _layout, _min_rows
    set_skinny_rows(rows, layout, min_rows)
    try:
        yield
    finally:
        set_skinny_rows(*saved)


def clear_packed_weights() -> None:
    """Free every packed copy the ``"packed"`` layout holds (they are rebuilt on next use)."""
    _packed.clear()


def _packed_weight(weight: torch.Tensor, bucket: int | str) -> torch.Tensor:
    # A stale copy would silently compute with old weights: in-place updates bump _version, moves change data_ptr.
    stamp = (weight._version, weight.data_ptr())
    copies = _packed.setdefault(weight, {})
    if bucket not in copies or copies[bucket][:2] != stamp:
        if bucket == _ONEDNN:
            # The second argument is only a row-count hint for choosing the blocking; any row count may follow.
            copy = torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), SKINNY_ROWS)
        else:
            copy = torch.ops.mkl._mkl_reorder_linear_weight(weight.contiguous(), bucket)
        copies[bucket] = (*stamp, copy)
    return copies[bucket][2]


def _packed_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, rows: int) -> torch.Tensor:
    bucket = next(b for b in PACKED_BUCKETS if b >= rows)
    padded = x.new_zeros(bucket, x.shape[-1])
    padded[:rows] = x.reshape(rows, x.shape[-1])
    out = torch.ops.mkl._mkl_linear(padded, _packed_weight(weight, bucket), weight, bias, bucket)
    return out[:rows].reshape(*x.shape[:-1], weight.shape[0])


class CallRows(NamedTuple):
    """How a bf16 product of one weight shape is cut into oneDNN calls (:func:`bf16_call_rows`)."""

    fewest: int
    """1, or 2 where oneDNN rounds a call of one row apart from calls of more: single rows then go in padded
    with a zero row."""
    most: int
    """The most rows one call takes."""


def bf16_call_rows(out_features: int, in_features: int, packed: bool = False) -> CallRows:
    """How few-row bf16 products with an ``[out_features, in_features]`` weight are cut into calls on this CPU so
    that every row comes out bit for bit as it does alone; ``packed`` for the oneDNN-packed copy, else
    ``F.linear``.

    oneDNN picks its kernel, and with it the order of each dot product's sums, by the shape of the whole call, and
    which calls keep rows apart differs between CPUs. On a Xeon with AMX every SmolLM2-135M weight keeps up to 32
    rows apart (``CallRows(1, 32)``). On an AMD EPYC with AVX-512 BF16 its 576 × 1536 down projection multiplies a
    single row in one order and 2 to 32 rows in another, the same for every row: padding single rows with a zero
    row puts them in the multi-row order, and calls of 2 to 32 rows then give every row what a padded single row
    gets (``CallRows(2, 32)``), at no cost, since a call of 2 rows is as fast as one of 1 there. So it is
    measured, once per shape, layout and thread count in a process, at first use: :data:`BF16_INVARIANT_ROWS`
    rows are multiplied one call each, then in calls of 2, 3, … rows each, and ``most`` is the row count before
    the first that changes a bit. Where that is below :data:`BF16_INVARIANT_ROWS`, the same is measured against
    single rows padded to two, and the plan that takes more rows per call is kept. A call of one row is its own
    reference, so the answer is at least ``CallRows(1, 1)`` and few-row products always keep rows apart.

    Summed in another order, a dot product of random values mostly rounds to the same bf16 output, so random rows
    alone would miss most kernels that mix rows. The probe's rows make every order leave its mark: the weight's
    columns come in equal pairs, and each row puts +2¹⁶ and −2¹⁶ on one such pair. The two terms cancel exactly,
    but the small terms summed while only one of them is in lose low bits of the size of the result, and which
    terms those are depends on the order.
    """
    return _measured_call_rows(out_features, in_features, packed, torch.get_num_threads())


@functools.cache
def _measured_call_rows(out_features: int, in_features: int, packed: bool, threads: int) -> CallRows:
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(out_features, in_features, generator=gen)
    x = torch.randn(BF16_INVARIANT_ROWS, in_features, generator=gen)
    pairs = in_features // 2
    if pairs:
        weight[:, 1:2 * pairs:2] = weight[:, 0:2 * pairs:2]
        pair = 2 * torch.randint(0, pairs, (BF16_INVARIANT_ROWS,), generator=gen)
        every_row = torch.arange(BF16_INVARIANT_ROWS)
        x[every_row, pair], x[every_row, pair + 1] = 2.0 ** 16, -(2.0 ** 16)
    weight, x = weight.bfloat16(), x.bfloat16()
    copy = torch.ops.mkldnn._reorder_linear_weight(weight, SKINNY_ROWS) if packed else None
    product = _bf16_product(weight, None, copy)

    def most_rows(fewest: int) -> int:
        alone = _in_calls(x, 1, fewest, product)
        for rows in range(2, BF16_INVARIANT_ROWS + 1):
            if not torch.equal(_in_calls(x, rows, fewest, product), alone):
                return rows - 1
        return BF16_INVARIANT_ROWS

    with torch.no_grad():
        plain = CallRows(1, most_rows(1))
        if plain.most == BF16_INVARIANT_ROWS:
            return plain
        padded = CallRows(2, most_rows(2))
    return padded if padded.most > plain.most else plain


def _bf16_product(weight: torch.Tensor, bias: torch.Tensor | None,
                  packed_copy: torch.Tensor | None) -> Callable[[torch.Tensor], torch.Tensor]:
    """``x ↦ x @ weight.T + bias`` by oneDNN's product with ``packed_copy`` (the weight's packed layout), or by
    ``F.linear`` when it is ``None``."""
    if packed_copy is not None:
        return lambda part: torch.ops.mkldnn._linear_pointwise(part, packed_copy, bias, "none", [], "")
    return lambda part: F.linear(part, weight, bias)


def _in_calls(flat: torch.Tensor, most: int, fewest: int,
              product: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """``product`` of the rows of ``flat [rows, in]`` in calls of at most ``most`` rows, a call of fewer than
    ``fewest`` rows padded with zero rows → ``[rows, out]``."""
    chunks = []
    for part in flat.split(most):
        if part.shape[0] < fewest:
            padding = part.new_zeros(fewest - part.shape[0], part.shape[1])
            chunks.append(product(torch.cat([part, padding]))[:part.shape[0]])
        else:
            chunks.append(product(part))
    return chunks[0] if len(chunks) == 1 else torch.cat(chunks)


def _bf16_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, rows: int,
                 packed: bool) -> torch.Tensor:
    plan = bf16_call_rows(*weight.shape, packed=packed)
    product = _bf16_product(weight, bias, _packed_weight(weight, _ONEDNN) if packed else None)
    if plan.fewest <= rows <= plan.most:
        # One call, as nearly every decoding step makes. Both products flatten leading dims themselves, into the
        # same [rows, in] GEMM, and skipping the split and reshapes here saves about a fifth of a small call.
        return product(x)
    out = _in_calls(x.reshape(rows, x.shape[-1]), plan.most, plan.fewest, product)
    return out.reshape(*x.shape[:-1], weight.shape[0])


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ weight.T + bias`` for ``x [..., in]``, ``weight [out, in]``, ``bias [out]`` → ``[..., out]``.

    Few-row CPU inputs take the current few-row layout (see the module docstring); everything else ``F.linear``.
    """
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    if x.device.type != "cpu" or not _min_rows <= rows <= _skinny_rows or x.dtype != weight.dtype:
        return F.linear(x, weight, bias)
    needs_grad = torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad
                                              or (bias is not None and bias.requires_grad))
    # Inference tensors keep no version counter, so an in-place update could not be told from a stale copy.
    packable = not needs_grad and not weight.is_inference() and (bias is None or bias.dtype == x.dtype)
    if weight.dtype == torch.bfloat16:
        return _bf16_linear(x, weight, bias, rows, packed=_layout == "packed" and packable
                            and packed_layout_available(torch.bfloat16))
    if _layout == "packed":
        if not packable or rows == 1 or weight.dtype != torch.float32 or not packed_layout_available(torch.float32):
            return F.linear(x, weight, bias)
        return _packed_linear(x, weight, bias, rows)
    out = (weight @ x.reshape(rows, x.shape[-1]).T).T
    if bias is not None:
        out = out + bias
    return out.contiguous().reshape(*x.shape[:-1], weight.shape[0])


class Linear(nn.Linear):
    """``nn.Linear`` computed by :func:`linear`: the same parameters, a faster layout for few rows on CPU."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)


def use_skinny_linears(module: nn.Module) -> int:
    """Turn every plain ``nn.Linear`` inside ``module`` into a :class:`Linear`, in place; returns how many.

    The layers keep their parameters (tied weights stay tied), hooks and state-dict keys; subclasses of
    ``nn.Linear`` (quantised or LoRA layers) are left alone, since their forward is their own.
    """
    swapped = 0
    for layer in module.modules():
        if type(layer) is nn.Linear:
            layer.__class__ = Linear
            swapped += 1
    return swapped
