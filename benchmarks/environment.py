"""What every benchmark result records: machine, versions, commit, time."""

from __future__ import annotations

import datetime
import json
import os
import platform
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parent / "results"


def environment() -> dict:
    info = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": platform.machine(),
        "processor": platform.processor() or platform.machine(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "commit": _commit(),
        "device": "cpu",
    }
    try:
        import triton

        info["triton"] = triton.__version__
    except Exception:
        info["triton"] = None
    if torch.cuda.is_available():
        info["device"] = torch.cuda.get_device_name(0)
        info["capability"] = ".".join(map(str, torch.cuda.get_device_capability(0)))
    return info


def cpu_model() -> str | None:
    """The CPU's model name as Linux reports it (``platform.processor()`` is often just the architecture), or
    ``None`` where ``/proc/cpuinfo`` does not say. Speed results differ by CPU far more than by version."""
    try:
        lines = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    for line in lines:
        key, _, value = line.partition(":")
        if key.strip() == "model name" and value.strip():
            return value.strip()
    return None


def _commit() -> str:
    # A copy of the tree without .git (the lent GPU machine) is told its commit through the environment.
    if os.environ.get("DSPARK_COMMIT"):
        return os.environ["DSPARK_COMMIT"]
    from dspark.train.trainer import source_commit

    return source_commit()


def scratch_results() -> Path:
    """Where a benchmark writes unless told otherwise: ``$DSPARK_RESULTS``, else ``$DSPARK_CACHE/results``. The
    tracked ``benchmarks/results/`` (what the paper is built from) changes only with ``--out benchmarks/results``."""
    if os.environ.get("DSPARK_RESULTS"):
        return Path(os.environ["DSPARK_RESULTS"])
    from dspark.runtime.target import cache_root

    return cache_root() / "results"


def write_result(name: str, payload: dict, directory: Path | None = None) -> Path:
    """Write ``{"environment": …, **payload}`` as ``<directory>/<name>.json`` atomically (default:
    :func:`scratch_results`)."""
    from dspark.io import atomic_write_text

    path = Path(directory or scratch_results()) / f"{name}.json"
    atomic_write_text(path, json.dumps({"environment": environment(), **payload}, indent=2) + "\n")
    return path
