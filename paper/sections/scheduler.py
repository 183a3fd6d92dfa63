"""§5: the scheduler: throughput against load, and Appendix A."""

from __future__ import annotations

from pathlib import Path

from paper.common import load, machine, num, quote, stale_note
from paper.figures import pyplot, save

DECISIONS = ("rounds", "tau", "mean_verify_length", "rounds_without_drafts")


def same_decisions(a: dict, b: dict) -> bool:
    """Whether two whole decodes of the same requests made the same rounds: then only timing tells them apart."""
    return a["requests"] == b["requests"] and "tau" in a and all(a.get(k) == b.get(k) for k in DECISIONS)


def backoff_effect(rows: list[dict]) -> str:
    """A sentence on what back-off did to Algorithm 1, counting only the R where it changed a decision."""
    without = {r["requests"]: r for r in rows if r["policy"] == "algorithm-1"}
    changed = [(r, without[r["requests"]]) for r in rows if r["policy"].startswith("algorithm-1-backoff")
               and r["requests"] in without and not same_decisions(r, without[r["requests"]])]
    if not changed:
        return " Back-off changed none of Algorithm 1's decisions."
    return (" Where back-off changed Algorithm 1's decisions, it decoded at "
            + ", ".join(f"{num(r['tokens_per_s'] / w['tokens_per_s'], '.2f')}× Algorithm 1 without it at "
                        f"R = {num(r['requests'], 'd')}" for r, w in changed) + ".")


def timing_noise(rows: list[dict]) -> str:
    """A sentence on the spread between decodes that made the same decisions, and between plain decoding and a
    policy that verified almost no drafts (under 0.05 per request and round), or "" where there are neither."""
    plain = {r["requests"]: r for r in rows if r["policy"] == "no speculation"}
    pairs = [(a, b) for i, a in enumerate(rows) for b in rows[i + 1:] if same_decisions(a, b)]
    near_plain = [(plain[r["requests"]], r) for r in rows
                  if r["requests"] in plain and r.get("mean_verify_length", 1.0) < 0.05]

    def spread(pair: tuple[dict, dict]) -> float:
        speeds = [row["tokens_per_s"] for row in pair]
        return max(speeds) / min(speeds)

    clauses = []
    if pairs:
        a, b = max(pairs, key=spread)
        clauses.append(f"at R = {num(a['requests'], 'd')}, {a['policy']} and {b['policy']} made the same decisions "
                       f"({num(a['rounds'], 'd')} rounds, τ {num(a['tau'], '.2f')}) and timed "
                       f"{num(a['tokens_per_s'], '.1f')} and {num(b['tokens_per_s'], '.1f')} tokens/s")
    if near_plain:
        a, b = max(near_plain, key=spread)
        clauses.append(f"at R = {num(b['requests'], 'd')}, {b['policy']} verified "
                       f"{num(b['mean_verify_length'], '.2f')} drafts per request and round "
                       f"(τ {num(b['tau'], '.2f')}), close to plain decoding, and timed "
                       f"{num(b['tokens_per_s'], '.1f')} tokens/s against plain decoding's "
                       f"{num(a['tokens_per_s'], '.1f')}")
    if not clauses:
        return ""
    widest = max(spread(pair) for pair in pairs + near_plain)
    return (" Each cell is one decode: " + "; ".join(clauses) + f". So differences up to "
            f"{num(100 * (widest - 1), '.0f')}% in this table can be timing noise alone.")


def section_scheduler(out: list[str], figures: Path) -> None:
    out.append("## 5. The scheduler: throughput against load, and Appendix A\n")
    result = load("scheduler")
    if result is None:
        out.append("*Not measured yet: run `python benchmarks/bench_sps.py`, then `benchmarks/bench_scheduler.py`.*\n")
    else:
        _scheduler_method(out, result)
        replay = result["replay"]
        for table in dict.fromkeys(r["sps"] for r in replay):
            for pool in dict.fromkeys(r["pool"] for r in replay if r["sps"] == table):
                _scheduler_table(out, [r for r in replay if r["sps"] == table and r["pool"] == pool], table, pool)
        _figure_scheduler(replay, figures)
        out.append("![Throughput against load](figures/scheduler.png)\n")
        out.append("*Figure 5. Each policy's realised tokens/s divided by the best fixed verify length's at the "
                   "same R (replay by replay; the red line is parity), per SPS table and round pool; verify passes "
                   "only unless marked *drafting charged*, where Algorithm 1 plans with the draft cost too. Bands: "
                   f"{num(95, 'd')}% intervals over the replays. The vLLM "
                   "re-measurement of the paper's scheduler found adaptive verification "
                   f"{quote(5, 'd')}–{quote(10, 'd')}% ahead of the best fixed length up to concurrency "
                   f"{quote(64, 'd')} and {quote(90, 'd')}% ahead at {quote(256, 'd')}.*\n")
    measured = load("scheduler_measured_cpu")
    if measured is not None:
        planned = "" if "precision" not in measured else (
            f"; target and drafter in {measured['precision']}, and the policies that read an SPS table planned "
            "with one profiled on this machine at start-up for each R")
        out.append(f"Whole decodes on this CPU with the real target and the trained drafter "
                   f"({num(measured['max_new_tokens'], 'd')} new tokens per request, T = 1, drafting included"
                   f"{planned}; {machine(measured)}), tokens/s:\n")
        out.append(stale_note(measured, "the earlier drafter"))
        rows = measured["rows"]
        policies = list(dict.fromkeys(r["policy"] for r in rows))
        counts = sorted({r["requests"] for r in rows})
        out.append("| policy | " + " | ".join(f"R = {num(c, 'd')}" for c in counts) + " |")
        out.append("|---|" + "---|" * len(counts))
        for policy in policies:
            cells = {r["requests"]: r for r in rows if r["policy"] == policy}
            values = " | ".join(num(cells[c]["tokens_per_s"], ".1f") for c in counts)
            out.append(f"| {policy} | {values} |")
        out.append("")
        skipping = [r for r in rows if r.get("rounds_without_drafts")]
        if skipping:
            shares = ", ".join(f"{r['policy']} at R = {num(r['requests'], 'd')}: "
                               f"{num(r['rounds_without_drafts'], 'd')} of {num(r['rounds'], 'd')}"
                               for r in skipping)
            out.append("Algorithm 1 runs a round as a plain target step, without drafting, when it could send no "
                       "draft even at confidence 1, and with back-off (`PrefixScheduler(backoff=N)`) also for "
                       "1, 2, 4, … up to N rounds after rounds that sent none; the rounds so run were "
                       f"{shares}.")
            plain = {r["requests"]: r["tokens_per_s"] for r in rows if r["policy"] == "no speculation"}
            backoff = [r for r in rows if r["policy"].startswith("algorithm-1-backoff")]
            if backoff and plain:
                out.append("Against no speculation, Algorithm 1 with back-off decodes at "
                           + ", ".join(f"{num(r['tokens_per_s'] / plain[r['requests']], '.2f')}× at "
                                       f"R = {num(r['requests'], 'd')}" for r in backoff)
                           + " (without back-off: "
                           + ", ".join(f"{num(r['tokens_per_s'] / plain[r['requests']], '.2f')}×" for r in rows
                                       if r["policy"] == "algorithm-1")
                           + ")." + backoff_effect(rows) + timing_noise(rows))
            out.append("")
    appendix = load("appendix_a")
    if appendix is not None:
        out.append(f"**Appendix A.** The paper's example: one request, γ = 2, target ({quote(0.7)}, {quote(0.3)}), "
                   f"draft ({quote(0.5)}, {quote(0.5)}), c₁ = {quote(0.8)} and c₂ = 1 or 0 depending on the sampled "
                   f"first draft, SPS(1, 2, 3) = 1, {quote(0.5)}, {quote(0.45)}. dspark's scheduler and "
                   "verifier, run over an exact lattice of uniforms, give P(first token = A) = "
                   f"{num(appendix['p_first_A_with_early_stop'], '.4f')} with the early stop (the target's "
                   f"{num(appendix['target_p_A'], '.2f')}: lossless) and "
                   f"{num(appendix['p_first_A_without_early_stop'], '.4f')} without it (the paper: "
                   f"{quote(0.85, '.2f')} vs {quote(0.70, '.2f')}).\n")


def _profile(profile: dict) -> str:
    return (f"c_k = d_t·({num(profile['slot1'], 'g')} − {num(profile['decay'], 'g')}·(k−1)); a request's difficulty "
            f"d_t wanders around its own level, logit(d_t) = μ + x_t with x_t = {num(profile['persistence'], 'g')}·"
            f"x_(t−1) + {num(profile['noise'], 'g')}·ε_t and μ the logit of a Beta({num(profile['beta'][0], 'g')}, "
            f"{num(profile['beta'][1], 'g')}) draw; requests last {num(profile['mean_lifetime_steps'], 'd')} steps "
            "on average")


def _scheduler_method(out: list[str], result: dict) -> None:
    out.append("**How it was measured.** `benchmarks/bench_sps.py` profiles the target's verify pass: R requests "
               "of 8 tokens (B = 8R) over their own KV caches, median latency per B. `benchmarks/bench_scheduler.py` "
               "then replays R request slots for "
               f"{num(result['steps'], 'd')} steps: each step every slot brings a drafted round, each policy "
               "chooses verify lengths from the confidences, and the step costs the SPS table's latency for its B "
               "(plus one draft step when drafting is charged, and Algorithm 1 then plans with that cost). "
               "Realised tokens are 1 + min(A, ℓ) per request, A being the prefix the round accepted with all γ "
               f"slots verified. Each point is replayed with {num(result['seeds'], 'd')} seeds, every policy on "
               f"the same rounds; intervals are Student-t {num(95, 'd')}% intervals of the mean, and ratios are "
               "taken seed by "
               "seed. Round pools: *paper-profile*, synthetic calibrated rounds shaped like the paper's "
               f"acceptance ({_profile(result['paper_profile'])}); *trained*, the DSpark drafter's held-out rounds "
               "with its STS temperatures, drawn independently per slot. Policies: fixed lengths, threshold at "
               f"c_k ≥ {num(result['threshold'], 'g')}, Algorithm 1 on fresh confidences, *production* (budget "
               "by global argmax on the confidences of two steps earlier, top-K over current ones) and "
               f"*production-ema{num(result['ema'], 'g')}* (the same budget from per-request moving averages "
               f"m_t = {num(result['ema'], 'g')}·m_(t−1) + {num(1 - result['ema'], 'g')}·c_t, as vLLM sizes it). "
               "A fixed length whose pass exceeds a table's capacity at some R is left out there. "
               f"Replay run on {machine(result)}.\n")
    calibration = load("calibration_cpu")
    if calibration is not None:  # the trained pool is the calibration study's rounds
        out.append(stale_note(calibration, "the earlier drafter (the trained pool's rounds)"))
    out.append("SPS tables, and where each came from:\n")
    for name, labels in result["tables"].items():
        out.append(f"- *{name}*: {labels['verify']}; drafting: {labels['drafting']}.")
    roof = result["roofline"]
    out.append(f"\nThe *h200-roofline* table is a model, not a measurement: latency = max((weights + R·KV) / "
               f"bandwidth, B·flops / throughput) + {num(roof['overhead_s'] * 1e3, 'g')} ms, with B padded to the "
               "next captured batch size (1, 2, 4, then multiples of 8), KV the cache of "
               f"{num(roof['context_tokens'], 'd')} context tokens per request, the bandwidth the lent H200's "
               f"device copy reached ({num(roof['bandwidth_bytes_per_s'] / 1e9, '.0f')} GB/s) and "
               f"{num(roof['achievable_fraction'], 'g')} of its {num(roof['bf16_peak_flops'] / 1e12, '.0f')} "
               "TFLOPS datasheet bf16 peak (not measured). The memory-bound plateau widens with R's KV reads and "
               "the pass then slows once compute dominates, the shape a serving engine presents.\n")


def _lead(cells: list[dict], requests: int, drafting: bool) -> dict | None:
    return next((r for r in cells if r["requests"] == requests and r["drafting"] == drafting
                 and r["policy"] == "algorithm-1"), None)


def _scheduler_table(out: list[str], cells: list[dict], table: str, pool: str) -> None:
    counts = sorted({r["requests"] for r in cells})
    out.append(f"*{table}, {pool} rounds*: realised tokens/s, verify passes only (Algorithm 1 and the production "
               f"variants as ratios to the best fixed length at that R, seed by seed, with {num(95, 'd')}% "
               "intervals):\n")
    out.append("| R | best fixed | its tokens/s | algorithm-1 | production | production-ema | threshold | "
               "algorithm-1, drafting charged |")
    out.append("|---|---|---|---|---|---|---|---|")

    def ratio(r):
        if r is None:
            return "-"
        lo, hi = r["vs_best_fixed_ci95"]
        return f"{num(r['vs_best_fixed'], '.2f')}× [{num(lo, '.2f')}, {num(hi, '.2f')}]"

    for requests in counts:
        at = [r for r in cells if r["requests"] == requests and not r["drafting"]]
        fixed = [r for r in at if r["policy"].startswith("fixed-")]
        best = max(fixed, key=lambda r: r["realised_tokens_per_s"])
        by = {r["policy"]: r for r in at}
        threshold = next((r for r in at if r["policy"].startswith("threshold")), None)
        out.append(f"| {num(requests, 'd')} | {best['policy']} | {num(best['realised_tokens_per_s'], '.0f')} | "
                   f"{ratio(by.get('algorithm-1'))} | {ratio(by.get('production'))} | "
                   f"{ratio(next((r for p, r in by.items() if p.startswith('production-ema')), None))} | "
                   f"{ratio(threshold)} | {ratio(_lead(cells, requests, True))} |")
    out.append("")
    out.append(_scheduler_verdict(cells) + "\n")


def _scheduler_verdict(cells: list[dict]) -> str:
    """Where Algorithm 1 first leads the best fixed length by 10%, and its lead at the highest load."""
    counts = sorted({r["requests"] for r in cells})
    first = next((c for c in counts if (_lead(cells, c, False) or {}).get("vs_best_fixed", 0) >= 1.10), None)
    top, one = _lead(cells, counts[-1], False), _lead(cells, counts[0], False)
    lo, hi = top["vs_best_fixed_ci95"]
    text = (f"Algorithm 1 is {num(one['vs_best_fixed'], '.2f')}× the best fixed length at R = {num(counts[0], 'd')} "
            f"and {num(top['vs_best_fixed'], '.2f')}× [{num(lo, '.2f')}, {num(hi, '.2f')}] at R = "
            f"{num(counts[-1], 'd')}; ")
    text += (f"it first leads by 10% or more at R = {num(first, 'd')}." if first is not None
             else "it never leads by 10% on this table and pool.")
    return text


def _figure_scheduler(replay, figures: Path) -> None:
    plt = pyplot()
    tables = list(dict.fromkeys(r["sps"] for r in replay))
    pools = list(dict.fromkeys(r["pool"] for r in replay))
    fig, axes = plt.subplots(len(pools), len(tables), figsize=(4.6 * len(tables), 3.6 * len(pools)), squeeze=False,
                             sharey=True)
    # Wide translucent lines under narrow ones, so policies that coincide stay visible.
    lines = [("algorithm-1", False, dict(color="black", linewidth=4, alpha=0.35, marker="o")),
             ("production", False, dict(color="tab:cyan", linewidth=2, linestyle="-.", marker="x")),
             ("production-ema", False, dict(color="tab:purple", linewidth=1, linestyle="--", marker="+")),
             ("threshold", False, dict(color="tab:olive", linewidth=1, linestyle=":", marker="s", markersize=3)),
             ("algorithm-1", True, dict(color="tab:orange", linewidth=1.5, linestyle="--", marker="."))]
    for row, pool in enumerate(pools):
        for column, table in enumerate(tables):
            ax = axes[row][column]
            cells = [r for r in replay if r["sps"] == table and r["pool"] == pool]
            for policy, drafting, style in lines:
                pts = sorted((r["requests"], r["vs_best_fixed"], *r["vs_best_fixed_ci95"]) for r in cells
                             if r["policy"].startswith(policy) and r["drafting"] == drafting)
                label = f"{policy}{', drafting charged' if drafting else ''}"
                line, = ax.plot([q[0] for q in pts], [q[1] for q in pts], label=label, **style)
                ax.fill_between([q[0] for q in pts], [q[2] for q in pts], [q[3] for q in pts],
                                color=line.get_color(), alpha=0.15, linewidth=0)
            ax.axhline(1.0, color="tab:red", linewidth=0.8)
            ax.set_xscale("log", base=2)
            ax.set_xlabel("concurrent requests R")
            ax.set_title(f"{table}, {pool} rounds", fontsize=10)
            ax.grid(alpha=0.3)
        axes[row][0].set_ylabel("tokens/s ÷ best fixed length's")
    axes[0][0].legend(fontsize=7)
    save(fig, figures, "scheduler.png")
