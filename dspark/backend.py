"""Which implementation an op runs: ``reference`` (oracle), ``torch`` (module) or ``triton`` (fused)."""

from __future__ import annotations

import functools
import os

import torch

BACKENDS = ("auto", "reference", "torch", "triton")


@functools.lru_cache(maxsize=1)
def triton_available() -> bool:
    """True when Triton imports; checked once, lazily, so ``import dspark`` never imports Triton."""
    try:
        import triton  # noqa: F401
    except Exception:
        return False
    return True


def upload(host: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """``host`` on ``device`` without making the host wait: on a GPU a copy from pageable memory first waits for
    everything queued on the device, one from pinned memory does not (PyTorch keeps the pinned block alive until
    the copy is done). Without a GPU there is nothing to pin."""
    if torch.device(device).type == "cuda" and host.device.type == "cpu":
        return host.pin_memory().to(device, non_blocking=True)
    return host.to(device, non_blocking=True)


def resolve_backend(backend: str, *tensors: torch.Tensor | None) -> str:
    """Turn ``backend`` (or ``auto``) into a concrete one.

    ``auto`` picks Triton for CUDA tensors when Triton imports, PyTorch otherwise; the environment
    variable ``DSPARK_BACKEND`` overrides ``auto`` (never an explicit choice).
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    on_cuda = _any_on_cuda(tensors)
    if backend == "auto":
        forced = os.environ.get("DSPARK_BACKEND", "").strip()
        if forced and forced not in BACKENDS[1:]:
            raise ValueError(f"DSPARK_BACKEND must be one of {BACKENDS[1:]}, got {forced!r}")
        backend = forced or ("triton" if on_cuda and triton_available() else "torch")
    if backend == "triton" and not on_cuda and os.environ.get("TRITON_INTERPRET", "0") != "1":
        raise ValueError("backend='triton' needs CUDA tensors (Triton kernels run on a GPU), or TRITON_INTERPRET=1 "
                         "set before Triton is imported to run them slowly on the CPU; use backend='torch' here")
    return backend


def _any_on_cuda(tensors: tuple) -> bool:
    # A loop, not any() over a generator, which takes twice as long: this runs on every call of every op.
    for t in tensors:
        if t is not None and t.is_cuda:
            return True
    return False
