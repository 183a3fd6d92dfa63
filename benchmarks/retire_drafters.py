"""Take committed drafters that only fed a result out of the tree, keeping what identifies and rebuilds them.

Each drafter under ``benchmarks/drafters/`` is an earlier phase of one arm of the committed recipe. Retiring it
records, in ``benchmarks/results/retired_drafters.json``: its ``config.json`` (the metadata every result and the
paper read: steps, data, curve, calibration), the sha256 and size of its weights, and the command and recipe
phase that rebuild it, then deletes its directory. Results that decoded it keep their numbers; to decode it
again, rebuild it and compare the hash (a CPU retrain is bit-exact on the machine that wrote it, close elsewhere).

Usage::

    python benchmarks/retire_drafters.py NAME [NAME ...]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.trained import ARMS, COMMITTED  # noqa: E402
from dspark.files.checkpoint import shipped_drafter_dir  # noqa: E402
from dspark.io import atomic_write_text  # noqa: E402
from dspark.train.recipe import load_recipe  # noqa: E402

RECIPE = ROOT / "benchmarks" / "recipes" / "smollm2_drafter.json"
RECORD = ROOT / "benchmarks" / "results" / "retired_drafters.json"
EARLIER = re.compile(r"(.+)-steps(\d+)")


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def rebuilding_phase(name: str) -> tuple[str, int, bool]:
    """(arm, phase number counted from 1, whether it is the arm's last phase) of the recipe phase that wrote
    ``name`` (``<arm directory>-steps<N>``): the one that ends at step N. Raises ``ValueError`` when no phase of
    any arm ends there."""
    match = EARLIER.fullmatch(name)
    if match is None:
        raise ValueError(f"{name!r} is not an earlier phase's drafter (<arm directory>-steps<N>)")
    directory, steps = match.group(1), int(match.group(2))
    arms = {folder: arm for arm, folder in ARMS.items()}
    if directory not in arms:
        raise ValueError(f"{name!r}: no arm writes {directory!r}; arms: {sorted(ARMS)}")
    arm = arms[directory]
    phases = load_recipe(RECIPE, None if arm == "dspark" else arm)
    done = 0
    for number, phase in enumerate(phases, start=1):
        done += phase["steps"]
        if done == steps:
            return arm, number, number == len(phases)
    raise ValueError(f"{name!r}: no phase of arm {arm!r} ends at step {steps}")


def record_of(directory: Path) -> dict:
    arm, phase, last = rebuilding_phase(directory.name)
    weights = directory / "model.safetensors"
    arm_flag = "" if arm == "dspark" else f" --arm {arm}"
    written = "OUT" if last else f"OUT-phases/phase{phase:02d}-steps*"
    digest = sha256(weights)
    shipped = shipped_drafter_dir() / "model.safetensors"
    same = {"same_weights_as": str(shipped.parent.relative_to(ROOT))} if digest == sha256(shipped) else {}
    return {"sha256": digest, "bytes": weights.stat().st_size, "arm": arm, "phase": phase,
            "rebuild": f"python -m dspark train --config benchmarks/recipes/{RECIPE.name}{arm_flag} --output OUT "
                       f"writes it to {written}",
            **same, "config": json.loads((directory / "config.json").read_text(encoding="utf-8"))}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="+", help="directory names under benchmarks/drafters/")
    args = parser.parse_args(argv)
    retired = json.loads(RECORD.read_text(encoding="utf-8")) if RECORD.exists() else {}
    directories = [COMMITTED / name for name in args.names]
    for directory in directories:
        if not (directory / "model.safetensors").is_file():
            raise SystemExit(f"{directory} holds no drafter")
    # Every record is written before any directory goes, so an interrupted run loses nothing.
    retired.update({directory.name: record_of(directory) for directory in directories})
    atomic_write_text(RECORD, json.dumps(dict(sorted(retired.items())), indent=1) + "\n")
    for directory in directories:
        shutil.rmtree(directory)
        record = retired[directory.name]
        print(f"retired {directory.name}: {record['sha256'][:12]}…, arm {record['arm']}, phase {record['phase']}")


if __name__ == "__main__":
    main()
