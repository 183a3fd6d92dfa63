"""Scheduler study: tokens/s against concurrency for fixed lengths, threshold, Algorithm 1 and production.

Two parts, both written to ``benchmarks/results/scheduler.json``:

1. **Replay** (expected and realised tokens/s, R = 1 … 64 requests). Each simulated step draws R rounds
   at random from a pool, asks the policy for verify lengths ℓ_r from the rounds' confidences, and charges
   the latency of a verify pass of B = Σ(1 + ℓ_r) tokens from an SPS table. *Expected* tokens count
   1 + Σ_{k≤ℓ} a_k (the confidence head's survival); *realised* tokens count 1 + min(A, ℓ), where A is
   the accepted prefix the round really had with all γ slots verified (verifying fewer slots with the same
   random numbers accepts exactly min(A, ℓ)). Only the target's verify pass is timed, as in the paper's
   objective (method.md §6.1); drafting is left out. Pools of rounds:
   * ``trained``: the trained DSpark drafter's held-out rounds (T = 1) with its out-of-sample STS
     temperatures, from ``calibration_cpu.json``;
   * ``paper-profile``: synthetic, calibrated rounds whose conditional acceptance follows the paper's
     shape (about 0.9 at slot 1, decaying along the block, per-request difficulty spread), so the
     policies can be compared where speculation pays.
   SPS tables: the real SmolLM2-135M target on this CPU (``sps_cpu.json``) and, when present, a Qwen3-8B
   architecture measured on a GPU (``sps_cuda.json``).
2. **Measured** (CPU, real target, trained drafter): whole decodes of R = 1, 4, 16 held-out prompts per
   policy, wall-clock tokens/s including drafting, against plain target decoding.

    python benchmarks/bench_scheduler.py [--steps 300] [--skip-measured]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.environment import RESULTS, write_result  # noqa: E402
from dspark.scheduler import FixedLength, PrefixScheduler, ProductionScheduler, SPSTable, Threshold  # noqa: E402

CONCURRENCY = [1, 2, 4, 8, 16, 32, 64]
THRESHOLD = 0.5


def policies(sps: SPSTable, gamma: int) -> list:
    return ([FixedLength(k) for k in range(gamma + 1)] + [Threshold(THRESHOLD), PrefixScheduler(sps),
                                                          ProductionScheduler(sps)])


def sps_tables(results: Path) -> dict[str, SPSTable]:
    tables = {}
    for device, wanted in (("cpu", "SmolLM2-135M-Instruct"), ("cuda", "qwen3-8b")):
        path = results / f"sps_{device}.json"
        if not path.exists():
            continue
        data = json.loads(path.read_text(encoding="utf-8"))
        for profile in data["profiles"]:
            if profile["model"] == wanted:
                rows = profile["rows"]
                name = f"{wanted} ({data['environment']['device']}, {profile['weights']} weights)"
                tables[name] = SPSTable.from_latencies([r["tokens"] for r in rows], [r["seconds"] for r in rows])
    return tables


def trained_pool(results: Path):
    """(conditional confidences [N, γ], accepted prefix [N]) of the trained drafter's held-out rounds."""
    data = json.loads((results / "calibration_cpu.json").read_text(encoding="utf-8"))
    rounds = data["eval_rounds_data"]
    logits = torch.tensor(rounds["logits"], dtype=torch.float64)
    temperatures = torch.tensor(data["temperatures"], dtype=torch.float64)
    full = torch.tensor(rounds["verified"]) == logits.shape[1]  # rounds cut short by max tokens are left out
    return torch.sigmoid(logits / temperatures)[full], torch.tensor(rounds["accepted"])[full]


PAPER_PROFILE = {"slot1": 0.92, "decay": 0.02, "beta": [8.0, 1.5]}


def paper_profile_pool(gamma: int, count: int = 20000, seed: int = 0):
    """Synthetic calibrated rounds: c_k = d · (0.92 − 0.02 (k − 1)), d ~ Beta(8, 1.5) per request; A drawn from c."""
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)  # Beta sampling draws from the global generator
    difficulty = torch.distributions.Beta(*PAPER_PROFILE["beta"]).sample((count, 1))
    slots = torch.arange(gamma)
    conditional = (difficulty * (PAPER_PROFILE["slot1"] - PAPER_PROFILE["decay"] * slots)).double().clamp(0, 1)
    accept = torch.rand(count, gamma, generator=gen, dtype=torch.float64) < conditional
    return conditional, accept.long().cumprod(-1).sum(-1)


def replay(policy, sps: SPSTable, confidence, accepted, requests: int, steps: int, seed: int) -> dict:
    gen = torch.Generator().manual_seed(seed)
    expected = realised = seconds = lengths = 0.0
    for _ in range(steps):
        pick = torch.randint(len(accepted), (requests,), generator=gen)
        conf, acc = confidence[pick], accepted[pick]
        verify = policy(conf).cpu()
        tokens = requests + int(verify.sum())
        latency = 1.0 / sps(tokens)
        survival = conf.cumprod(-1)
        slots = torch.arange(1, conf.shape[1] + 1)
        expected += float(requests + (survival * (slots <= verify[:, None])).sum())
        realised += float(requests + torch.minimum(acc, verify).sum())
        seconds += latency
        lengths += float(verify.float().mean())
    return {"expected_tokens_per_s": expected / seconds, "realised_tokens_per_s": realised / seconds,
            "mean_verify_length": lengths / steps, "realised_tokens_per_step_per_request": realised / steps / requests}


def replay_study(results: Path, steps: int) -> list[dict]:
    rows = []
    tables = sps_tables(results)
    if not tables:
        raise SystemExit("no SPS tables: run benchmarks/bench_sps.py first")
    trained = trained_pool(results)
    gamma = trained[0].shape[1]
    pools = {"trained": trained, "paper-profile": paper_profile_pool(gamma)}
    for table_name, sps in tables.items():
        for pool_name, (confidence, accepted) in pools.items():
            for requests in CONCURRENCY:
                if requests * (gamma + 1) > sps.max_tokens:
                    continue
                for policy in policies(sps, gamma):
                    row = replay(policy, sps, confidence, accepted, requests, steps, seed=requests)
                    rows.append({"sps": table_name, "pool": pool_name, "requests": requests, "policy": policy.name,
                                 **row})
                best = max((r for r in rows if r["sps"] == table_name and r["pool"] == pool_name
                            and r["requests"] == requests), key=lambda r: r["realised_tokens_per_s"])
                print(f"{table_name[:28]:28s} {pool_name:13s} R={requests:2d}: best {best['policy']:12s} "
                      f"{best['realised_tokens_per_s']:9.1f} tok/s", flush=True)
    return rows


def measured_study(results: Path, max_new_tokens: int) -> list[dict]:
    from dspark.checkpoint import find_default_drafter
    from dspark.data import DOMAINS, load_prompts
    from dspark.decoding import SamplingConfig, generate, speculative_generate
    from dspark.target import load_default_target

    target = load_default_target()
    drafter = find_default_drafter(target)
    cpu = [t for name, t in sps_tables(results).items() if "cpu" in name]
    sps = cpu[0] if cpu else None
    pool = [target.encode_chat(p.text) for i in range(6) for d in DOMAINS for p in load_prompts(d)[50 + i: 51 + i]]
    rows = []
    gamma = drafter.config.block_size
    chosen = [FixedLength(1), FixedLength(3), FixedLength(gamma), Threshold(THRESHOLD)]
    chosen += [PrefixScheduler(sps), ProductionScheduler(sps)] if sps is not None else []
    for requests in (1, 4, 16):
        prompts = pool[:requests]
        config = SamplingConfig(max_new_tokens=max_new_tokens, temperature=1.0, seed=0)
        start = time.perf_counter()
        plain = generate(target, prompts, config)
        seconds = time.perf_counter() - start
        rows.append({"requests": requests, "policy": "no speculation",
                     "tokens_per_s": sum(map(len, plain.tokens)) / seconds})
        for policy in chosen:
            if isinstance(policy, ProductionScheduler):
                policy = ProductionScheduler(sps)  # fresh history per run
            result = speculative_generate(target, drafter, prompts, config, scheduler=policy)
            rows.append({"requests": requests, "policy": policy.name, "tokens_per_s": result.tokens_per_second,
                         "tau": result.stats.as_dict()["tau"],
                         "mean_verify_length": float(result.stats.proposed.sum()) / max(result.stats.rounds, 1)})
        print("  ".join(f"{r['policy']}={r['tokens_per_s']:.1f}" for r in rows if r["requests"] == requests),
              flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=300, help="simulated steps per (table, pool, R, policy)")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--skip-measured", action="store_true")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    payload = {"steps": args.steps, "threshold": THRESHOLD, "paper_profile": PAPER_PROFILE,
               "replay": replay_study(RESULTS, args.steps)}
    if not args.skip_measured:
        payload["measured_cpu"] = measured_study(RESULTS, args.max_new_tokens)
        payload["measured_max_new_tokens"] = args.max_new_tokens
    print(write_result("scheduler", payload, args.out))


if __name__ == "__main__":
    main()
