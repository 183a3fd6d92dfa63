"""Scheduler study: tokens/s against concurrency (R = 1 … 512) for fixed lengths, threshold, Algorithm 1 and
the production variants, with 95% intervals over repeated replays.

**Replay** (``scheduler.json``). R request slots run for ``--steps`` steps. Each step every slot brings a
drafted round (its conditional confidences and the prefix A it accepts with all γ slots verified), the
policy chooses verify lengths ℓ_r from the confidences, and the step costs the SPS table's latency for a
verify pass of B = Σ(1 + ℓ_r) tokens; with ``drafting`` charged it also costs one draft step for R
requests, and Algorithm 1 then plans with that cost folded into its table (whole-step throughput instead
of the paper's verify-only objective). Realised tokens are 1 + min(A, ℓ_r) per request: verifying fewer
slots with the same random numbers accepts exactly min(A, ℓ). Each point is replayed with ``--seeds``
seeds; the interval is a Student-t 95% interval of the mean, and policies are compared seed by seed
(every policy replays the same rounds).

Round pools:

* ``paper-profile``: synthetic, calibrated rounds shaped like the paper's acceptance: c_k = d_t · (0.92 −
  0.02 (k − 1)), where a request's difficulty d_t wanders around its own level (logit(d_t) = μ_r + x_t,
  x_t = 0.7 x_{t−1} + 0.8 ε_t, μ_r the logit of a Beta(8, 1.5) draw) and A is drawn from c. A request
  finishes after a geometric number of steps (mean 64) and a new one takes its slot, so confidences seen
  two steps ago describe the same request, but not exactly.
* ``trained``: the trained drafter's held-out rounds (T = 1) with its out-of-sample STS temperatures, from
  ``calibration_cpu.json``; slots draw rounds independently (the pool keeps no request identity).

Policies: ``fixed-0`` (no speculation) … ``fixed-γ``, ``threshold-0.5``, ``algorithm-1`` (the paper's
rule, fresh confidences), ``production`` (budget from the confidences of two steps earlier, top-K over
current ones) and ``production-ema0.8`` (the same budget from per-request moving averages, as vLLM sizes
it). A fixed length whose pass exceeds the table's capacity at some R is left out there.

SPS tables (``--tables``; each labelled in the results with where it came from):

* ``cpu``: the real SmolLM2-135M target measured on this CPU (``sps_cpu.json``); drafting cost measured by
  ``bench_e2e.py`` at batch 1 and 4 (``e2e_cpu.json``), linear in R.
* ``gpu-eager``: a random-weight Qwen3-8B architecture measured on the lent H200 in eager PyTorch
  (``sps_cuda.json``); drafting cost from the drafter roofline below.
* ``h200-roofline``: a serving-shaped table *derived, not measured*: a Qwen3-8B verify pass on an H200 with
  CUDA graphs, ``max((weights + R · KV(context)) / bandwidth, B · flops / bf16 throughput) + overhead``
  with B padded to the next captured batch size, the bandwidth a device copy measured on that H200
  (``kernels_gpu.json``), and the card's dense bf16 peak derated as stated in ``ROOFLINE``; drafting
  cost is the same model for a one-layer drafter with the target's LM head and a rank-256 Markov head.

**Whole decodes** (``scheduler_measured_cpu.json``, ``--measured``): R = 1, 4, 16 held-out prompts per
policy with the real target and the trained drafter on this CPU, wall-clock tokens/s including drafting. Target
and drafter run as the demo and ``bench_e2e.py`` run them (``--precision``, default auto), and the policies that
read an SPS table plan with one profiled here at start-up for each R, as an engine would
(``dspark.runtime.profiling.choose_few_row_layout``, which also keeps this CPU's fastest layout of few-row products).

    python benchmarks/bench_scheduler.py [--steps 60] [--seeds 5] [--measured [--no-replay]] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.environment import RESULTS, write_result  # noqa: E402
from dspark.demo import BACKOFF
from dspark.scheduler import FixedLength, PrefixScheduler, ProductionScheduler, SPSTable, Threshold  # noqa: E402

CONCURRENCY = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
THRESHOLD = 0.5
EMA = 0.8
GAMMA = 7
PAPER_PROFILE = {"slot1": 0.92, "decay": 0.02, "beta": [8.0, 1.5], "persistence": 0.7, "noise": 0.8,
                 "mean_lifetime_steps": 64}
# Qwen3-8B on an H200, the stated model behind the "h200-roofline" table.
ROOFLINE = {
    "target_params": 8.19e9, "layers": 36, "hidden": 4096, "kv_heads": 8, "head_dim": 128, "vocab": 151936,
    "context_tokens": 2048, "bytes_per_param": 2,
    "bf16_peak_flops": 989e12, "achievable_fraction": 0.6,  # H200 datasheet dense bf16; derated for real GEMMs
    "overhead_s": 1e-3,  # launch of the captured graph, sampling, scheduling: an assumption
    "draft_params": 193e6 + 5 * 4096 * 4096, "markov_rank": 256,  # one Qwen3-8B-sized layer plus the tap fusion
    "max_tokens": 4608,
}
CAPTURED = [1, 2, 4] + list(range(8, ROOFLINE["max_tokens"] + 1, 8))  # batch sizes with a captured graph


# -- SPS tables and drafting costs, per concurrency ---------------------------------------------------------


@dataclass
class CostModel:
    """Where a table came from, the verify table at R requests, and the seconds of one draft step for R."""

    label: str
    table: Callable[[int], SPSTable]
    draft_seconds: Callable[[int], float]
    draft_label: str


def _measured_table(path: Path, model: str) -> tuple[SPSTable, str] | None:
    if not path.exists():
        return None
    data = json.loads(path.read_text(encoding="utf-8"))
    for profile in data["profiles"]:
        if profile["model"].lower() == model.lower():
            rows = profile["rows"]
            label = f"{profile['model']}, measured on {data['environment']['device']} ({profile['weights']} weights)"
            return SPSTable.from_latencies([r["tokens"] for r in rows], [r["seconds"] for r in rows]), label
    return None


def _roofline_latency(tokens: torch.Tensor, weight_bytes: float, flops_per_token: float,
                      bandwidth: float) -> torch.Tensor:
    flops = ROOFLINE["bf16_peak_flops"] * ROOFLINE["achievable_fraction"]
    return torch.maximum(torch.full_like(tokens, weight_bytes / bandwidth), tokens * flops_per_token / flops) \
        + ROOFLINE["overhead_s"]


def roofline_target(requests: int, bandwidth: float) -> SPSTable:
    """Serving-shaped Qwen3-8B verify table on an H200 at ``requests`` concurrent requests (see module doc)."""
    m = ROOFLINE
    kv_per_token = 2 * m["layers"] * m["kv_heads"] * m["head_dim"] * m["bytes_per_param"]
    weight_bytes = m["target_params"] * m["bytes_per_param"] + requests * m["context_tokens"] * kv_per_token
    flops_per_token = 2 * m["target_params"] + 4 * m["layers"] * m["context_tokens"] * m["hidden"]
    captured = torch.tensor(CAPTURED, dtype=torch.float64)
    grid = torch.arange(m["max_tokens"] + 1, dtype=torch.float64)
    padded = captured[torch.searchsorted(captured, grid.clamp(min=1))]  # a pass runs at its captured size
    latency = _roofline_latency(padded, weight_bytes, flops_per_token, bandwidth)
    return SPSTable.from_latencies(list(range(1, m["max_tokens"] + 1)), latency[1:].tolist())


def roofline_draft_seconds(requests: int, bandwidth: float) -> float:
    """One draft step (γ slots for each of R requests) of a one-layer drafter with the target's LM head."""
    m = ROOFLINE
    params = m["draft_params"] + m["vocab"] * (m["hidden"] + m["markov_rank"])
    tokens = torch.tensor([float(requests * GAMMA)], dtype=torch.float64)
    return float(_roofline_latency(tokens, params * m["bytes_per_param"], 2 * params, bandwidth)[0])


def cpu_draft_seconds(results: Path) -> Callable[[int], float] | None:
    """Seconds of a draft step on this CPU: measured at batch 1 and 4 by bench_e2e, linear in R.

    Read from the static-batch rows that verify every slot, where every round drafts (Algorithm 1 with back-off
    skips some).
    """
    path = results / "e2e_cpu.json"
    if not path.exists():
        return None
    rows = {r["batch"]: r for r in json.loads(path.read_text(encoding="utf-8"))["rows"]
            if r["scheduler"] == "every slot" and r.get("batching", "static") == "static"}
    if not {1, 4} <= rows.keys():
        return None
    at = {b: rows[b]["round_parts_in_target_steps"]["draft"] * rows[b]["target_step_ms"] / 1e3 for b in (1, 4)}
    slope = (at[4] - at[1]) / 3
    return lambda requests: at[1] + slope * (requests - 1)


def cost_models(results: Path, wanted: list[str]) -> dict[str, CostModel]:
    """The ``wanted`` tables whose inputs ``results`` holds (a table without them is left out)."""
    models = {}
    bandwidth = measured_bandwidth(results)
    roofline_drafting = "roofline of a one-layer drafter on the H200 (derived)"
    if "cpu" in wanted:
        measured, draft = _measured_table(results / "sps_cpu.json", "SmolLM2-135M-Instruct"), cpu_draft_seconds(results)
        if measured and draft:
            models["cpu"] = CostModel(measured[1], lambda r, t=measured[0]: t, draft,
                                      "measured by bench_e2e at batch 1 and 4, linear in R")
    if "gpu-eager" in wanted and bandwidth:
        measured = _measured_table(results / "sps_cuda.json", "qwen3-8b")
        if measured:
            models["gpu-eager"] = CostModel(measured[1] + ", eager PyTorch", lambda r, t=measured[0]: t,
                                            lambda r: roofline_draft_seconds(r, bandwidth), roofline_drafting)
    if "h200-roofline" in wanted and bandwidth:
        tables: dict[int, SPSTable] = {}

        def table(requests: int) -> SPSTable:
            if requests not in tables:
                tables[requests] = roofline_target(requests, bandwidth)
            return tables[requests]

        label = ("Qwen3-8B on an H200 with CUDA graphs, derived from the copy bandwidth measured on the lent H200 "
                 "(kernels_gpu.json) and the ROOFLINE model")
        models["h200-roofline"] = CostModel(label, table, lambda r: roofline_draft_seconds(r, bandwidth),
                                            roofline_drafting)
    return models


def with_drafting(table: SPSTable, draft_seconds: float) -> SPSTable:
    """The table a planner uses when each step also costs ``draft_seconds``: 1 / (1/SPS(B) + draft)."""
    return SPSTable(1.0 / (1.0 / table.sps + draft_seconds))


# -- round pools -------------------------------------------------------------------------------------------


def paper_profile_rounds(requests: int, seed: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Endless steps of (conditional confidences [R, γ], accepted prefix [R]) from persistent requests."""
    p = PAPER_PROFILE
    gen = torch.Generator().manual_seed(seed)
    beta = torch.distributions.Beta(*p["beta"])
    shape = p["slot1"] - p["decay"] * torch.arange(GAMMA, dtype=torch.float64)

    def new_levels(count: int) -> torch.Tensor:
        torch.manual_seed(int(torch.randint(2**31, (1,), generator=gen)))  # Beta draws use the global generator
        return torch.logit(beta.sample((count,)).double().clamp(1e-4, 1 - 1e-4))

    level = new_levels(requests)
    wander = torch.zeros(requests, dtype=torch.float64)
    while True:
        done = torch.rand(requests, generator=gen, dtype=torch.float64) < 1 / p["mean_lifetime_steps"]
        if bool(done.any()):
            level[done] = new_levels(int(done.sum()))
            wander[done] = 0
        wander = p["persistence"] * wander + p["noise"] * torch.randn(requests, generator=gen, dtype=torch.float64)
        conditional = (torch.sigmoid(level + wander)[:, None] * shape).clamp(0, 1)
        accepted = torch.rand(requests, GAMMA, generator=gen, dtype=torch.float64) < conditional
        yield conditional, accepted.long().cumprod(-1).sum(-1)


def trained_rounds(results: Path) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(conditional confidences [N, γ], accepted prefix [N]) of the trained drafter's held-out rounds."""
    path = results / "calibration_cpu.json"
    if not path.exists():
        return None
    data = json.loads(path.read_text(encoding="utf-8"))
    rounds = data["eval_rounds_data"]
    logits = torch.tensor(rounds["logits"], dtype=torch.float64)
    temperatures = torch.tensor(data["temperatures"], dtype=torch.float64)
    full = torch.tensor(rounds["verified"]) == logits.shape[1]  # rounds cut short by max tokens are left out
    return torch.sigmoid(logits / temperatures)[full], torch.tensor(rounds["accepted"])[full]


def independent_rounds(pool, requests: int, seed: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    confidence, accepted = pool
    gen = torch.Generator().manual_seed(seed)
    while True:
        pick = torch.randint(len(accepted), (requests,), generator=gen)
        yield confidence[pick], accepted[pick]


# -- the replay ----------------------------------------------------------------------------------------------


def policies(plan: SPSTable) -> list:
    return ([FixedLength(k) for k in range(GAMMA + 1)]
            + [Threshold(THRESHOLD), PrefixScheduler(plan), ProductionScheduler(plan, lag=2),
               ProductionScheduler(plan, lag=2, smoothing=EMA)])


def replay_point(model: CostModel, rounds: Callable[[int], Iterator], requests: int, drafting: bool, steps: int,
                 seed: int) -> dict[str, dict]:
    """Every policy over the same ``steps`` steps of rounds: realised and expected tokens/s, mean ℓ."""
    table = model.table(requests)
    draft = model.draft_seconds(requests) if drafting else 0.0
    plan = with_drafting(table, draft) if drafting else table
    stream = rounds(seed)
    steps_data = [next(stream) for _ in range(steps)]
    out = {}
    slots = torch.arange(1, GAMMA + 1)
    for policy in policies(plan):
        realised = expected = seconds = length = 0.0
        for confidence, accepted in steps_data:
            verify = policy(confidence).cpu()
            tokens = requests + int(verify.sum())
            if tokens > table.max_tokens:
                break  # this policy's pass does not fit the table at this load: left out of the point
            seconds += 1.0 / table(tokens) + draft
            realised += requests + float(torch.minimum(accepted, verify).sum())
            expected += requests + float((confidence.cumprod(-1) * (slots <= verify[:, None])).sum())
            length += float(verify.double().mean())
        else:
            out[policy.name] = {"realised_tokens_per_s": realised / seconds,
                                "expected_tokens_per_s": expected / seconds, "mean_verify_length": length / steps}
    return out


def t_interval(values: list[float]) -> tuple[float, float, float]:
    """Mean and Student-t 95% interval of the mean."""
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, mean, mean
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    t = {2: 12.706, 3: 4.303, 4: 3.182, 5: 2.776, 6: 2.571, 7: 2.447, 8: 2.365, 9: 2.306, 10: 2.262}.get(n, 1.96)
    half = t * sd / math.sqrt(n)
    return mean, mean - half, mean + half


def replay_study(results: Path, tables: list[str], steps: int, seeds: int) -> tuple[list[dict], dict]:
    models = cost_models(results, tables)
    if not models:
        raise SystemExit("no SPS tables: run benchmarks/bench_sps.py (and bench_kernels.py on a GPU) first")
    pools: dict[str, Callable] = {"paper-profile": lambda r: (lambda seed: paper_profile_rounds(r, seed))}
    trained = trained_rounds(results)
    if trained is not None:
        pools["trained"] = lambda r: (lambda seed: independent_rounds(trained, r, seed))
    cells = [(name, pool, requests, drafting) for name in models for pool in pools for requests in CONCURRENCY
             for drafting in (False, True) if requests <= models[name].table(requests).max_tokens]
    rows = []
    with tqdm(total=len(cells) * seeds, desc="replay", unit="point") as bar:
        for name, pool, requests, drafting in cells:
            per_seed = []
            for seed in range(seeds):
                per_seed.append(replay_point(models[name], pools[pool](requests), requests, drafting, steps,
                                             seed=1000 * requests + seed))
                bar.update(1)
            fitting = [p for p in per_seed[0] if all(p in point for point in per_seed)]
            fixed = [p for p in fitting if p.startswith("fixed-")]
            best_fixed = [max(point[p]["realised_tokens_per_s"] for p in fixed) for point in per_seed]
            for policy in fitting:
                realised = [point[policy]["realised_tokens_per_s"] for point in per_seed]
                mean, lo, hi = t_interval(realised)
                ratio, ratio_lo, ratio_hi = t_interval([v / b for v, b in zip(realised, best_fixed)])
                rows.append({"sps": name, "pool": pool, "requests": requests, "drafting": drafting, "policy": policy,
                             "realised_tokens_per_s": mean, "ci95": [lo, hi],
                             "vs_best_fixed": ratio, "vs_best_fixed_ci95": [ratio_lo, ratio_hi],
                             "expected_tokens_per_s": sum(p[policy]["expected_tokens_per_s"] for p in per_seed) / seeds,
                             "mean_verify_length": sum(p[policy]["mean_verify_length"] for p in per_seed) / seeds})
            alg1 = next(r for r in rows[::-1] if r["policy"] == "algorithm-1")
            bar.set_postfix_str(f"{name} {pool} R={requests} drafting={drafting}: algorithm-1 "
                                f"{alg1['vs_best_fixed']:.2f}x best fixed")
    labels = {name: {"verify": m.label, "drafting": m.draft_label} for name, m in models.items()}
    return rows, labels


def measured_bandwidth(results: Path) -> float | None:
    """Bytes/s of the device copy bench_kernels measured on the lent GPU, the roofline's bandwidth."""
    path = results / "kernels_gpu.json"
    return json.loads(path.read_text(encoding="utf-8"))["peak_bandwidth_gbps"] * 1e9 if path.exists() else None


# -- whole decodes on this CPU ------------------------------------------------------------------------------


def measured_study(max_new_tokens: int, precision: str) -> tuple[list[dict], str, str]:
    """Whole decodes at R = 1, 4, 16; returns ``(rows, the target's precision, the drafter)``, the last two as the
    demo describes them."""
    from dspark.demo import load_demo_drafter, load_demo_target
    from dspark.runtime.decoding import SamplingConfig, generate, speculative_generate
    from dspark.runtime.profiling import choose_few_row_layout
    from dspark.runtime.prompts import DOMAINS, load_prompts

    target, how = load_demo_target(precision)
    drafter, description = load_demo_drafter(target)
    pool = [target.encode_chat(p.text) for i in range(6) for d in DOMAINS for p in load_prompts(d)[50 + i: 51 + i]]
    rows = []
    gamma = drafter.config.block_size
    for requests in (1, 4, 16):
        sps = choose_few_row_layout(target, requests * (gamma + 1), requests=requests)
        # Built per R and run once each: no policy carries history or back-off from one decode to the next.
        policies = [FixedLength(1), FixedLength(3), FixedLength(gamma), Threshold(THRESHOLD), PrefixScheduler(sps),
                    PrefixScheduler(sps, backoff=BACKOFF), ProductionScheduler(sps)]
        prompts = pool[:requests]
        config = SamplingConfig(max_new_tokens=max_new_tokens, temperature=1.0, seed=0)
        start = time.perf_counter()
        plain = generate(target, prompts, config)
        seconds = time.perf_counter() - start
        rows.append({"requests": requests, "policy": "no speculation",
                     "tokens_per_s": sum(map(len, plain.tokens)) / seconds})
        for policy in policies:
            result = speculative_generate(target, drafter, prompts, config, scheduler=policy)
            rows.append({"requests": requests, "policy": policy.name, "tokens_per_s": result.tokens_per_second,
                         "tau": result.stats.as_dict()["tau"],
                         "mean_verify_length": float(result.stats.proposed.sum()) / max(result.stats.rounds, 1),
                         "rounds": result.steps, "rounds_without_drafts": result.rounds_without_drafts})
        print("  ".join(f"{r['policy']}={r['tokens_per_s']:.1f}" for r in rows if r["requests"] == requests),
              flush=True)
    return rows, how, description


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=60, help="simulated steps per replay")
    parser.add_argument("--seeds", type=int, default=5, help="replays per point (the intervals' sample)")
    parser.add_argument("--tables", nargs="+", default=["cpu", "gpu-eager", "h200-roofline"])
    parser.add_argument("--measured", action="store_true", help="also time whole decodes on this CPU")
    parser.add_argument("--no-replay", action="store_true", help="leave out the replay (with --measured: only the "
                        "whole decodes)")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--precision", choices=["auto", "bf16", "fp32"], default="auto",
                        help="the whole decodes' target and drafter (--measured)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if args.steps < 1 or args.seeds < 1:
        raise SystemExit("--steps and --seeds must be positive")
    if not args.no_replay:
        rows, labels = replay_study(RESULTS, args.tables, args.steps, args.seeds)
        print(write_result("scheduler", {"steps": args.steps, "seeds": args.seeds, "threshold": THRESHOLD,
                                         "ema": EMA, "paper_profile": PAPER_PROFILE,
                                         "roofline": {**ROOFLINE, "bandwidth_bytes_per_s": measured_bandwidth(RESULTS)},
                                         "tables": labels, "replay": rows}, args.out))
    if args.measured:
        rows, precision, drafter = measured_study(args.max_new_tokens, args.precision)
        print(write_result("scheduler_measured_cpu", {"max_new_tokens": args.max_new_tokens, "precision": precision,
                                                      "drafter": drafter, "sps": "profiled at start-up per R",
                                                      "rows": rows}, args.out))


if __name__ == "__main__":
    main()
