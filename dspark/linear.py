"""Linear layers laid out for the few rows a decoding step feeds.

A decoding step feeds one token per request, a verify pass a handful. On CPUs, ``F.linear(x, W)`` with a
single row of ``x`` runs as a matrix-vector product that streams ``W`` once, but with 2 to 64 rows it runs as
a GEMM that, going by the timings below, pays for repacking ``W`` on every call, so feeding two tokens to a
target cost far more than feeding one. Computed as ``(W · xᵀ)ᵀ``, the same product hands BLAS ``W`` as the
tall left operand and the few rows as a narrow right one, a shape it streams ``W`` through once.
``benchmarks/bench_sps.py`` times both layouts, pass by pass: on a 2-core AMD EPYC with MKL
(``sps_cpu.json``), a pass of the SmolLM2-135M target over 2 / 4 / 8 tokens cost 1.61 / 1.65 / 1.85
one-token passes with ``F.linear`` and 0.87 / 0.80 / 1.36 in this layout. That is the verify pass's cost,
and so what speculative decoding can gain, on CPUs.

Which layout is faster depends on the CPU and its BLAS, though: on a 2-core Intel Xeon with AMX
(``sps_cpu_xeon.json``), ``F.linear`` ran passes of one, 2 and 4 tokens faster (65 / 75 / 102 ms against 70 /
107 / 113 ms in this layout), and at 8 tokens the two were within 6%. So the layout is a process-wide setting
(:func:`set_skinny_rows`, :func:`few_row_layout`), and :func:`dspark.decoding.choose_few_row_layout` times the
target's verify pass in both at start-up and keeps the faster.

``Linear`` is ``nn.Linear`` with that layout on CPU inputs of at most :func:`skinny_rows` rows; it has the
same parameters and state-dict keys, so checkpoints and exports do not see it. On GPUs, and for longer
inputs (prefill, training batches), it is ``F.linear``. Both layouts compute the same dot products; results
agree to the dtype's rounding, not bitwise, because the products accumulate in another order.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

SKINNY_ROWS = 64
"""The default setting: inputs with at most this many rows take the ``(W · xᵀ)ᵀ`` layout on CPU. On the AMD
EPYC it made the whole target forward faster at every width measured from 2 to 64 tokens; single products of
150 rows (a prefill) timed about even in the two layouts, so longer inputs keep ``F.linear``."""

_skinny_rows = SKINNY_ROWS


def skinny_rows() -> int:
    """The most rows a CPU input may have to take the ``(W · xᵀ)ᵀ`` layout now (0: it is off)."""
    return _skinny_rows


def set_skinny_rows(rows: int) -> None:
    """Let CPU inputs of 1 … ``rows`` rows take the ``(W · xᵀ)ᵀ`` layout from now on (0 turns it off)."""
    global _skinny_rows
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 0:
        raise ValueError(f"rows must be an int >= 0, got {rows!r}")
    _skinny_rows = rows


@contextlib.contextmanager
def few_row_layout(rows: int) -> Iterator[None]:
    """Run the block with :func:`set_skinny_rows` at ``rows``, then restore the previous setting."""
    saved = _skinny_rows
    set_skinny_rows(rows)
    try:
        yield
    finally:
        set_skinny_rows(saved)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ weight.T + bias`` for ``x [..., in]``, ``weight [out, in]``, ``bias [out]`` → ``[..., out]``.

    Few-row CPU inputs take the ``(W · xᵀ)ᵀ`` layout (see the module docstring); everything else ``F.linear``.
    """
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    if x.device.type != "cpu" or not 0 < rows <= _skinny_rows or x.dtype != weight.dtype:
        return F.linear(x, weight, bias)
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
