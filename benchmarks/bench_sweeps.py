"""Depth and block-length sweeps (paper Figs. 3 and 4) for DSpark and DFlash drafters of the default target.

Every point trains a drafter on the same cached data (ShareGPT prompts answered by SmolLM2-135M-Instruct)
for the same number of steps, then reads its held-out τ_prob = 1 + Σ_k Π_{i≤k} c*_k (method.md §8): the
expected accepted length of T = 1 chain verification with teacher-forced prefixes, on held-out sequences.
Depth runs at γ = 7 with 1, 2 and 3 layers; block-length runs at 1 layer with γ = 3, 7 and 15 (draft
length 4, 8, 16). Each run checkpoints and resumes, so an interrupted sweep picks up where it stopped.

    python benchmarks/bench_sweeps.py [--steps 200]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.environment import write_result  # noqa: E402

POINTS = [("depth", 1, 7), ("depth", 2, 7), ("depth", 3, 7), ("block", 1, 3), ("block", 1, 15)]


def run(steps: int, objectives: list[str]) -> dict:
    from dspark.target import cache_root
    from dspark.training import train_default_drafter

    rows = []
    for objective in objectives:
        for sweep, layers, gamma in POINTS:
            out = cache_root() / "sweeps" / f"{objective}-layers{layers}-block{gamma}-steps{steps}"
            start = time.perf_counter()
            if not (out / "config.json").exists():
                # The committed recipe's data and settings; only depth, block length and steps vary.
                train_default_drafter(out, objective=objective, steps=steps, num_draft_layers=layers,
                                      block_size=gamma, calibrate=False)
            meta = json.loads((out / "config.json").read_text(encoding="utf-8"))["metadata"]
            final = meta["final"]
            rows.append({"objective": objective, "sweep": sweep, "layers": layers, "block_size": gamma,
                         "steps": meta["steps"], "eval_tau_prob": final["eval_tau_prob"],
                         "eval_accuracy": final["eval_accuracy"], "train_loss": final["loss"],
                         "seconds_this_run": time.perf_counter() - start})
            print(f"{objective:7s} layers {layers} γ {gamma:2d}: τ_prob {final['eval_tau_prob']:.3f}", flush=True)
    return {"steps": steps, "measure": "held-out tau_prob (T=1, teacher-forced prefixes)", "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--objectives", nargs="+", default=["dspark", "dflash"])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    print(write_result("sweeps", run(args.steps, args.objectives), args.out))


if __name__ == "__main__":
    main()
