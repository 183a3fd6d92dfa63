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
(:func:`set_skinny_rows`, :func:`few_row_layout`), and :func:`dspark.decoding.choose_few_row_layout` times the
target's verify pass in each layout at start-up and keeps the fastest.

A third layout hands the repacking to MKL once: ``"packed"`` keeps, per weight, a copy that MKL's
``sgemm_pack`` has laid out for its GEMM kernel, and multiplies few-row fp32 inputs against it with
``sgemm_compute``, so no call repacks ``W`` (``bench_sps.py`` times it as ``packed``). Each copy is sized for
a bucket of rows (4, 8, 16, 32 or 64: the input is padded with zero rows up to its bucket, the use MKL
documents), costs the weight's memory again per bucket used, and is dropped with the weight or by
:func:`clear_packed_weights`; an in-place change to the weight (an optimiser step, ``load_state_dict``) makes
it repack. Single rows stay matrix-vector products, and on some CPUs MKL multiplies 2 or 3 rows without
repacking too, so the setting also says from how many rows the layout starts (``min_rows``). It needs a torch
built with MKL (:func:`packed_layout_available`: x86 CPU wheels are) and inputs that need no gradient; others
take ``F.linear``.

``Linear`` is ``nn.Linear`` with these layouts on CPU inputs of at most :func:`skinny_rows` rows; it has the
same parameters and state-dict keys, so checkpoints and exports do not see it. On GPUs, and for longer
inputs (prefill, training batches), it is ``F.linear``. All layouts compute the same dot products; results
agree to the dtype's rounding, not bitwise, because the products accumulate in another order.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

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
"""The few-row layouts: ``(W · xᵀ)ᵀ``, and MKL-packed weights (see the module docstring)."""

PACKED_BUCKETS = (4, 8, 16, 32, 64)

_skinny_rows = SKINNY_ROWS
_layout = "transposed"
_min_rows = 1
_packed: WeakIdKeyDictionary = WeakIdKeyDictionary()  # weight -> {bucket: (version, data_ptr, packed copy)}


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


def describe_layout() -> str:
    """The current setting in words, for reports."""
    if _skinny_rows == 0:
        return "F.linear"
    first = max(_min_rows, 2) if _layout == "packed" else _min_rows
    span = f"up to {_skinny_rows} rows" if first == 1 else f"{first} to {_skinny_rows} rows"
    return f"MKL-packed weights for {span}" if _layout == "packed" else f"(W·xᵀ)ᵀ for {span}"


def packed_layout_available() -> bool:
    """Whether this torch has the MKL packed GEMM that the ``"packed"`` layout calls."""
    return torch.backends.mkl.is_available() and hasattr(torch.ops.mkl, "_mkl_linear")


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
    if layout == "packed" and not packed_layout_available():
        raise ValueError("the packed layout needs a torch built with MKL (torch.backends.mkl.is_available() is "
                         "False here)")
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


def _packed_weight(weight: torch.Tensor, bucket: int) -> torch.Tensor:
    # A stale copy would silently compute with old weights: in-place updates bump _version, moves change data_ptr.
    stamp = (weight._version, weight.data_ptr())
    copies = _packed.setdefault(weight, {})
    if bucket not in copies or copies[bucket][:2] != stamp:
        copies[bucket] = (*stamp, torch.ops.mkl._mkl_reorder_linear_weight(weight.contiguous(), bucket))
    return copies[bucket][2]


def _packed_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, rows: int) -> torch.Tensor:
    bucket = next(b for b in PACKED_BUCKETS if b >= rows)
    padded = x.new_zeros(bucket, x.shape[-1])
    padded[:rows] = x.reshape(rows, x.shape[-1])
    out = torch.ops.mkl._mkl_linear(padded, _packed_weight(weight, bucket), weight, bias, bucket)
    return out[:rows].reshape(*x.shape[:-1], weight.shape[0])


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ weight.T + bias`` for ``x [..., in]``, ``weight [out, in]``, ``bias [out]`` → ``[..., out]``.

    Few-row CPU inputs take the current few-row layout (see the module docstring); everything else ``F.linear``.
    """
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    if x.device.type != "cpu" or not _min_rows <= rows <= _skinny_rows or x.dtype != weight.dtype:
        return F.linear(x, weight, bias)
    if _layout == "packed":
        needs_grad = torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad
                                                  or (bias is not None and bias.requires_grad))
        # Inference tensors keep no version counter, so an in-place update could not be told from a stale copy.
        if rows == 1 or weight.dtype != torch.float32 or needs_grad or weight.is_inference() or (
                bias is not None and bias.dtype != x.dtype):
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
