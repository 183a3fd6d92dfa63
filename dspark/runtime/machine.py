"""What this machine runs best: the CPU allocator's settings and the faster of bf16 and fp32."""

from __future__ import annotations

import ctypes
import functools
import sys
import time

import torch


def tune_cpu_allocator() -> bool:
    """Have glibc keep freed memory for reuse instead of handing it back to the system at once.

    A CPU training step allocates and frees dozens of ``[rows, V]`` buffers of tens to hundreds of MB each
    (a batched step at 16 sequences of the recipe's shape makes 350 MB ones). By default glibc maps every
    buffer above its mmap threshold afresh and unmaps it when freed, so every step pays the page faults of
    touching them again: about 15% of a recipe step on 2 cores at 4 sequences, a third at 16. This serves
    every allocation from the heap (no mmap, since the threshold itself cannot be raised above 32 MiB) and
    sets the trim threshold to 2 GiB, so freed buffers are reused; the resident set then stays near its peak.
    Linux with glibc only; returns whether it applied. ``python -m dspark train`` calls it first; in a
    notebook, call it before training.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False
    m_trim_threshold, m_mmap_max = -1, -4
    return bool(mallopt(m_mmap_max, 0)) and bool(mallopt(m_trim_threshold, 2**31 - 1))


@functools.cache
def fastest_precision(device: str = "cpu") -> str:
    """``"bf16"`` where bf16 matrix products run faster than fp32 ones on ``device``, else ``"fp32"``.

    On a GPU, bf16. CPUs differ by two orders of magnitude: with bf16 units (AMX, AVX-512 BF16) a bf16
    product is about twice as fast as an fp32 one, while on AVX2-only CPUs PyTorch emulates bf16 and runs it
    tens of times slower (70× on a 2-core AVX2 EPYC). So on a CPU a product of the drafter's MLP shape is
    timed in both, once per process.
    """
    if torch.device(device).type == "cuda":
        return "bf16"
    best = {}
    for dtype in (torch.float32, torch.bfloat16):
        a, b = torch.randn(128, 576, dtype=dtype), torch.randn(576, 768, dtype=dtype)
        a @ b  # the first call pays one-time dispatch and packing costs
        times = []
        for _ in range(3):
            start = time.perf_counter()
            a @ b
            times.append(time.perf_counter() - start)
        best[dtype] = min(times)
    return "bf16" if best[torch.bfloat16] < best[torch.float32] else "fp32"


def resolve_precision(precision: str, device: str = "cpu") -> str:
    """``"bf16"`` or ``"fp32"`` for a requested ``precision``: itself, or for ``"auto"`` :func:`fastest_precision`
    on ``device``; anything else is refused."""
    if precision not in ("auto", "fp32", "bf16"):
        raise ValueError(f"precision must be 'auto', 'fp32' or 'bf16', got {precision!r}")
    return fastest_precision(device) if precision == "auto" else precision
