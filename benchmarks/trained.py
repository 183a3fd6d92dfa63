"""Where the benchmarks find the drafters that the committed recipe trains for the default target.

A drafter that ``python -m dspark train --config benchmarks/recipes/smollm2_drafter.json [--arm ...]``
wrote to the dspark cache wins; otherwise the committed one is used: the DSpark drafter ships inside the
package, the baselines under ``benchmarks/drafters/``, so the comparisons can be re-run on a fresh checkout
without retraining.

The arms: ``dspark`` (the recipe's twelve phases: two passes over its data, a third and a fourth, a fifth and
sixth in one schedule, four more in another, four and a half more in another, 8,000 steps more with
standard-library code prompts added, 6,000 more with word problems added too, 6,000 more on the whole code and
word-problem pools, 4,000 more with a second series of word problems added, 4,000 more with a third, and 4,000
more with a second series of code prompts), ``dflash`` and ``eagle3`` (its ``--arm`` baselines; DFlash for the
first three phases, EAGLE-3 for 2,000 steps), and ``dspark-ce``, the DSpark drafter trained on cross-entropy
alone (``--arm dspark-ce``: ``ce_weight`` 1, ``l1_weight`` 0, the first three phases): the DSpark architecture
with DFlash's loss, which separates what the Markov head adds from what the L1 term adds. Each continued arm's
earlier drafters are committed as ``<name>-steps<N>``: :func:`equal_budget_drafters` finds the DSpark one at
DFlash's steps, so the two can still be compared at equal training budget.
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path

from dspark.train.pipeline import loss_weights_suffix

ARMS = {"dspark": "smollm2-135m-instruct-dspark", "dflash": "smollm2-135m-instruct-dflash",
        "eagle3": "smollm2-135m-instruct-eagle3",
        "dspark-ce": "smollm2-135m-instruct-dspark" + loss_weights_suffix(1.0, 0.0)}
COMMITTED = Path(__file__).resolve().parent / "drafters"


def candidates(arm: str) -> list[Path]:
    """The directories that may hold ``arm``'s drafter, the one to prefer first."""
    from dspark.files.checkpoint import default_drafter_dir, shipped_drafter_dir

    if arm not in ARMS:
        raise ValueError(f"unknown arm {arm!r}: expected one of {tuple(ARMS)}")
    cached = default_drafter_dir().with_name(ARMS[arm])
    committed = shipped_drafter_dir() if arm == "dspark" else COMMITTED / cached.name
    return [cached, committed]


def trained_drafters() -> dict[str, Path]:
    """arm -> directory of its trained drafter, for the arms that have one."""
    found = {}
    for arm in ARMS:
        for directory in candidates(arm):
            if (directory / "model.safetensors").exists():
                found[arm] = directory
                break
    return found


def trained_at(directory: Path) -> str | None:
    """When training wrote the drafter in ``directory`` (ISO 8601, UTC): its recorded ``trained_at``, else, for
    a drafter in the cache written before that was recorded, its config's mtime; ``None`` when unknown (the
    mtime of a committed file is when it was checked out)."""
    from dspark.runtime.target import cache_root

    config = directory / "config.json"
    recorded = json.loads(config.read_text(encoding="utf-8")).get("metadata", {}).get("trained_at")
    if recorded is not None:
        return recorded
    if directory.resolve().is_relative_to(cache_root().resolve()):
        written = datetime.datetime.fromtimestamp(config.stat().st_mtime, datetime.timezone.utc)
        return written.isoformat(timespec="seconds")
    return None


def _steps(directory: Path) -> int | None:
    return json.loads((directory / "config.json").read_text(encoding="utf-8")).get("metadata", {}).get("steps")


def equal_budget_drafters(found: dict[str, Path]) -> dict[str, Path]:
    """``{"dspark-steps<N>": directory}`` for the committed earlier DSpark drafter trained for the ``N`` steps of
    the DFlash drafter in ``found`` (arm -> directory, :func:`trained_drafters`), when the DSpark drafter there
    trained longer; else ``{}``."""
    if "dspark" not in found or "dflash" not in found:
        return {}
    steps, longer = _steps(found["dflash"]), _steps(found["dspark"])
    if steps is None or longer is None or longer <= steps:
        return {}
    earlier = COMMITTED / f"{ARMS['dspark']}-steps{steps}"
    if not (earlier / "model.safetensors").exists() or _steps(earlier) != steps:
        return {}
    return {f"dspark-steps{steps}": earlier}
