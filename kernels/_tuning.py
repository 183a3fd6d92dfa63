"""Launch configurations per architecture, pruned by what fits, and forced to one config in tests.

Each kernel lists configs for Hopper (sm_90) and Blackwell (sm_100 / sm_103, GB300). A config no GPU has
timed carries a ``label`` that says ``unmeasured``: every Blackwell config (the label also says what the
ahead-of-time compile matrix, ``benchmarks/compile_matrix.py``, found for it at the paper's shapes:
registers, spills, shared memory, tcgen05; the lists are ordered by it), and any Hopper config that no H200
lease has run. No speed is claimed for them; a Hopper config that ran says when.
A config is a plain dict: block sizes (kernel constexprs) plus ``num_warps`` and ``num_stages``.

Selection (:func:`launch`): under the Triton interpreter, or when ``DSPARK_FORCE_CONFIG=first`` (the test
suite), the first config that passes the predicate is used; on a GPU, ``DSPARK_AUTOTUNE=1`` times every
surviving config once per shape key with ``triton.testing.do_bench`` and keeps the fastest (kernels that
overwrite their inputs opt out, and so do the samplers, whose kernels must all run with one vocabulary
tile); otherwise the first surviving config is used (lists are ordered best-guess first).
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch

_chosen: dict[tuple, dict] = {}


# Triton decides whether a kernel is interpreted when it is decorated, at import, from this variable: it is read
# once here too, not on every launch.
_INTERPRETING = os.environ.get("TRITON_INTERPRET", "0") == "1"


def interpreting() -> bool:
    return _INTERPRETING


_PLANS: dict[tuple, object] = {}
_MAX_PLANS = 1024


def planned(key: tuple, build: Callable[[], object]) -> object:
    """A launcher's plan for ``key``: what it derives from a call's shapes, dtypes, device and options alone (launch
    config, grids, constexprs, constant tensors), built by ``build()`` on the first call and reused after.

    At a small batch a launcher's own Python is most of what a call costs the host; a plan leaves it the lookup,
    the outputs and the launches. The launch config is chosen when the plan is built, so ``DSPARK_FORCE_CONFIG``
    and ``DSPARK_AUTOTUNE`` take effect for shapes not seen before (as Triton's autotuner keeps its choice per
    key). Plans hold no per-call state: scratch buffers stay allocated per call.
    """
    plan = _PLANS.get(key)
    if plan is None:
        if len(_PLANS) >= _MAX_PLANS:
            _PLANS.clear()
        plan = _PLANS[key] = build()
    return plan


def arch_of(device: torch.device) -> str:
    if interpreting() or device.type != "cuda":
        return "interpreter"
    major, minor = torch.cuda.get_device_capability(device)
    if major >= 10:
        return "sm100"
    if major == 9:
        return "sm90"
    return "other"


def select_config(
    name: str,
    device: torch.device,
    table: dict[str, list[dict]],
    fits: Callable[[dict], bool],
    key: tuple,
    run: Callable[[dict], None] | None = None,
) -> dict:
    """Pick a config for kernel ``name`` on ``device`` for the shape ``key``.

    ``table`` maps ``interpreter`` / ``sm90`` / ``sm100`` / ``other`` to config lists; ``fits`` prunes the
    configs that cannot run at this shape; ``run(config)`` launches once (used only when autotuning).
    """
    arch = arch_of(device)
    candidates = [c for c in table.get(arch, table["other"]) if fits(c)]
    if not candidates:
        raise ValueError(f"no {name} launch config fits shape {key} on {arch}")
    force = os.environ.get("DSPARK_FORCE_CONFIG", "")
    if arch == "interpreter" or force == "first" or run is None or os.environ.get("DSPARK_AUTOTUNE") != "1":
        return _strip(candidates[0])
    cache_key = (name, arch, key)
    if cache_key not in _chosen:
        import triton.testing
        from triton.runtime.errors import OutOfResources

        timings = []
        for i, c in enumerate(candidates):
            try:
                timings.append((triton.testing.do_bench(lambda c=c: run(_strip(c)), warmup=5, rep=20), i))
            except OutOfResources:
                continue  # the size estimate let through a config this compiler cannot fit: skip it
        if not timings:
            raise ValueError(f"no {name} launch config compiled for shape {key} on {arch}")
        _chosen[cache_key] = _strip(candidates[min(timings)[1]])
    return _chosen[cache_key]


def launch(name: str, kernel, grid: tuple, args: tuple, constexprs: dict, *, device: torch.device,
           table: dict[str, list[dict]], key: tuple, fits: Callable[[dict], bool] = lambda c: True,
           tunable: bool = True, config: dict | None = None) -> None:
    """``kernel[grid](*args, **constexprs, **config)`` with the config :func:`select_config` picks.

    ``tunable=False`` for kernels that overwrite their inputs (they cannot be launched repeatedly to time them)
    and for launches that must share the first config with others; those pass the ``config`` they share, chosen
    once per call rather than once per launch (a launcher's host time is what a small batch pays for).
    """
    def run(chosen: dict) -> None:
        kernel[grid](*args, **constexprs, **chosen)

    run(config if config is not None else select_config(name, device, table, fits, key, run if tunable else None))


def shared_memory_bytes(device: torch.device) -> int:
    """Shared memory one program may use on ``device`` (the opt-in limit); 160 KiB off CUDA (interpreter)."""
    if device.type != "cuda":
        return 160 * 1024
    return getattr(torch.cuda.get_device_properties(device), "shared_memory_per_block_optin", 99 * 1024)


def _strip(config: dict) -> dict:
    return {k: v for k, v in config.items() if k != "label"}


def next_power_of_2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def accumulator(dtype: torch.dtype):
    """fp64 inputs accumulate in fp64 (the oracle's precision); everything else in fp32."""
    import triton.language as tl

    return tl.float64 if dtype == torch.float64 else tl.float32


# Tests set this so that every output a launcher allocates starts as NaN (floats) or a sentinel (ints):
# an element a kernel forgets to write then fails the comparison instead of passing by luck.
POISON_OUTPUTS = os.environ.get("DSPARK_POISON_OUTPUTS", "0") == "1"
INT_SENTINEL = -99


def empty_output(*shape, dtype: torch.dtype, device) -> torch.Tensor:
    if not POISON_OUTPUTS:
        return torch.empty(*shape, dtype=dtype, device=device)
    fill = float("nan") if dtype.is_floating_point else INT_SENTINEL
    return torch.full(shape, fill, dtype=dtype, device=device)


def empty_output_like(t: torch.Tensor, *, dtype: torch.dtype) -> torch.Tensor:
    """A contiguous output of ``t``'s shape and device: :func:`empty_output` at two thirds of its host time (no
    shape to unpack, no device to parse), for the launchers whose output has the shape of an input."""
    if not POISON_OUTPUTS:
        return torch.empty_like(t, dtype=dtype, memory_format=torch.contiguous_format)
    return empty_output(*t.shape, dtype=dtype, device=t.device)
