"""Reliability of the trained DSpark drafter's confidence head before and after STS (paper Fig. 6).

Rounds are recorded with every drafted slot verified (``FixedLength(γ)``, T = 1, the decoder's
``record_rounds``) on two disjoint sets of held-out prompts per domain: STS is fitted on the first
(``--fit-offset``) and every number is reported on the second (``--offset``, the prompts of the
acceptance benchmark), so the "after" column is out of sample. Per position k: the survival
``a_k = Π_{i≤k} σ(z_i / T_i)`` against the realised prefix event ``1[k ≤ A]``, its ECE, AUROC and Brier
score, and a 10-bin reliability diagram. The drafter's shipped temperatures are set aside: "before" is
the raw head (all T = 1). Writes ``benchmarks/results/calibration_cpu.json``, with the evaluation rounds
(raw logits, verified and accepted counts), which the scheduler study replays.

    python benchmarks/bench_calibration.py [--prompts-per-domain 8] [--max-new-tokens 48]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.environment import write_result  # noqa: E402
from dspark.calibration import (  # noqa: E402
    calibration_report,
    fit_sts,
    prefix_labels,
    reliability_bins,
    survival_from_logits,
)
from dspark.contract import ECE_BINS  # noqa: E402
from dspark.files.checkpoint import find_default_drafter  # noqa: E402
from dspark.runtime.decoding import SamplingConfig, SpeculativeDecoder  # noqa: E402
from dspark.runtime.prompts import DOMAINS, load_prompts  # noqa: E402
from dspark.runtime.target import load_default_target  # noqa: E402
from dspark.scheduler import FixedLength  # noqa: E402


def record_rounds(target, drafter, prompts: list[list[int]], max_new_tokens: int, seed: int):
    """``(logits [N, γ], verified [N], accepted [N])`` of every round, all slots verified, T = 1."""
    config = SamplingConfig(max_new_tokens=max_new_tokens, temperature=1.0, seed=seed)
    decoder = SpeculativeDecoder(target, drafter, config, scheduler=FixedLength(drafter.config.block_size),
                                 record_rounds=True)
    decoder.start(prompts).run()
    return tuple(torch.cat([r[i] for r in decoder.rounds]) for i in range(3))


def diagrams(logits, verified, accepted, temperatures) -> list[dict]:
    label, valid = prefix_labels(verified, accepted, logits.shape[1])
    survival = survival_from_logits(logits, temperatures)
    return [reliability_bins(survival[valid[:, k], k], label[valid[:, k], k].double()) for k in range(logits.shape[1])]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts-per-domain", type=int, default=8)
    parser.add_argument("--offset", type=int, default=50, help="first evaluation prompt of each domain")
    parser.add_argument("--fit-offset", type=int, default=60,
                        help="first STS-fitting prompt of each domain (MT-Bench has 80 prompts: keep it below 72)")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    target = load_default_target()
    drafter = find_default_drafter(target)
    if drafter is None:
        raise SystemExit("no trained DSpark drafter: run `python -m dspark train` first")
    drafter.sts_temperatures.fill_(1.0)
    n = args.prompts_per_domain
    if abs(args.fit_offset - args.offset) < n:
        raise SystemExit("the fitting and evaluation prompt ranges overlap: STS would be judged in sample")
    splits, counts = {}, {}
    for name, offset in (("fit", args.fit_offset), ("eval", args.offset)):
        prompts = [target.encode_chat(p.text) for d in DOMAINS for p in load_prompts(d)[offset: offset + n]]
        counts[name] = len(prompts)
        splits[name] = tuple(t.double() if t.is_floating_point() else t
                             for t in record_rounds(target, drafter, prompts, args.max_new_tokens, seed=offset))
        print(f"{name}: {len(prompts)} prompts, {splits[name][0].shape[0]} rounds", flush=True)
    temperatures = fit_sts(*splits["fit"])
    evaluation = splits["eval"]
    before = calibration_report(*evaluation)
    after = calibration_report(*evaluation, temperatures)
    for k in range(drafter.config.block_size):
        print(f"position {k + 1}: ECE {before.ece[k]:.4f} -> {after.ece[k]:.4f}  (T = {float(temperatures[k]):.3f})")
    write_result("calibration_cpu", {
        "prompts_per_domain": n, "offset": args.offset, "fit_offset": args.fit_offset,
        "max_new_tokens": args.max_new_tokens, "ece_bins": ECE_BINS, "fit_prompts": counts["fit"],
        "eval_prompts": counts["eval"], "fit_rounds": int(splits["fit"][0].shape[0]),
        "eval_rounds": int(evaluation[0].shape[0]), "temperatures": temperatures.tolist(),
        "before": before.as_dict(), "after": after.as_dict(),
        "diagram_before": diagrams(*evaluation, None), "diagram_after": diagrams(*evaluation, temperatures),
        # The evaluation rounds themselves: the scheduler study replays them (benchmarks/bench_scheduler.py).
        "eval_rounds_data": {"logits": [[round(float(z), 5) for z in row] for row in evaluation[0]],
                             "verified": evaluation[1].tolist(), "accepted": evaluation[2].tolist()},
    }, args.out)


if __name__ == "__main__":
    main()
