"""Where the benchmarks find the drafters that the committed recipe trains for the default target.

A drafter that ``python -m dspark train --config benchmarks/recipes/smollm2_drafter.json [--objective ...]``
wrote to the dspark cache wins; otherwise the committed one is used: the DSpark drafter ships inside the
package, the DFlash and EAGLE-3-style baselines under ``benchmarks/drafters/``, so the comparisons can be
re-run on a fresh checkout without retraining.
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path

OBJECTIVES = ("dspark", "dflash", "eagle3")
COMMITTED = Path(__file__).resolve().parent / "drafters"


def candidates(objective: str) -> list[Path]:
    """The directories that may hold ``objective``'s drafter, the one to prefer first."""
    from dspark.checkpoint import default_drafter_dir, shipped_drafter_dir

    if objective not in OBJECTIVES:
        raise ValueError(f"unknown objective {objective!r}: expected one of {OBJECTIVES}")
    cached = default_drafter_dir().with_name(f"smollm2-135m-instruct-{objective}")
    committed = shipped_drafter_dir() if objective == "dspark" else COMMITTED / cached.name
    return [cached, committed]


def trained_drafters() -> dict[str, Path]:
    """objective -> directory of its trained drafter, for the objectives that have one."""
    found = {}
    for objective in OBJECTIVES:
        for directory in candidates(objective):
            if (directory / "model.safetensors").exists():
                found[objective] = directory
                break
    return found


def trained_at(directory: Path) -> str | None:
    """When training wrote the drafter in ``directory`` (ISO 8601, UTC): its recorded ``trained_at``, else, for
    a drafter in the cache written before that was recorded, its config's mtime; ``None`` when unknown (the
    mtime of a committed file is when it was checked out)."""
    from dspark.target import cache_root

    config = directory / "config.json"
    recorded = json.loads(config.read_text(encoding="utf-8")).get("metadata", {}).get("trained_at")
    if recorded is not None:
        return recorded
    if directory.resolve().is_relative_to(cache_root().resolve()):
        written = datetime.datetime.fromtimestamp(config.stat().st_mtime, datetime.timezone.utc)
        return written.isoformat(timespec="seconds")
    return None
