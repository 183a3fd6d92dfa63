"""Depth and block-length sweeps (paper Figs. 3 and 4) for DSpark and DFlash drafters of the default target.

Every point trains a drafter on the same cached data (ShareGPT prompts answered by SmolLM2-135M-Instruct)
for the same number of steps, then reads its held-out τ_prob = 1 + Σ_k Π_{i≤k} c*_k (method.md §8): the
expected accepted length of T = 1 chain verification with teacher-forced prefixes, on held-out sequences.
Depth runs at γ = 7 with 1, 2 and 3 layers; block-length runs at 1 layer with γ = 3, 7 and 15 (draft
length 4, 8, 16). Every point is trained once per seed (the seed sets initial weights and sampled anchors, not
the data), so the spread between seeds shows how much of a difference training noise alone makes. Each run
checkpoints and resumes, and the results file is rewritten after every run, so an interrupted sweep keeps what
it finished and picks up where it stopped.

    python benchmarks/bench_sweeps.py [--steps 200] [--seeds 0 1 2] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.environment import write_result  # noqa: E402

POINTS = [("depth", 1, 7), ("depth", 2, 7), ("depth", 3, 7), ("block", 1, 3), ("block", 1, 15)]


def run(steps: int, objectives: list[str], seeds: list[int], out: Path | None) -> Path:
    from dspark.runtime.target import cache_root
    from dspark.train.pipeline import train_default_drafter

    rows = []
    path = None
    for seed in seeds:
        for objective in objectives:
            for sweep, layers, gamma in POINTS:
                run_dir = cache_root() / "sweeps" / f"{objective}-layers{layers}-block{gamma}-steps{steps}-seed{seed}"
                if not (run_dir / "config.json").exists():
                    # The committed recipe's data and settings; only depth, block length, steps and seed vary.
                    train_default_drafter(run_dir, objective=objective, steps=steps, num_draft_layers=layers,
                                          block_size=gamma, seed=seed, calibrate=False)
                meta = json.loads((run_dir / "config.json").read_text(encoding="utf-8"))["metadata"]
                final = meta["final"]
                rows.append({"objective": objective, "sweep": sweep, "layers": layers, "block_size": gamma,
                             "seed": seed, "steps": meta["steps"], "eval_tau_prob": final["eval_tau_prob"],
                             "eval_accuracy": final["eval_accuracy"], "train_loss": final["loss"],
                             "train_seconds": meta["run"]["seconds"]["train"]})
                print(f"seed {seed} {objective:7s} layers {layers} γ {gamma:2d}: τ_prob {final['eval_tau_prob']:.3f}",
                      flush=True)
                path = write_result("sweeps", {"steps": steps, "seeds": seeds,
                                               "measure": "held-out tau_prob (T=1, teacher-forced prefixes)",
                                               "rows": rows}, out)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--objectives", nargs="+", default=["dspark", "dflash"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--out", type=Path, default=None,
                        help="directory of the results file (default: a scratch directory, not the committed results)")
    args = parser.parse_args()
    print(run(args.steps, args.objectives, args.seeds, args.out))


if __name__ == "__main__":
    main()
