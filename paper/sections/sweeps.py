"""§3: gain over DFlash against depth and block length (Figs. 3 and 4)."""

from __future__ import annotations

from pathlib import Path

from paper.common import COLORS, LABELS, machine, num, quote, results
from paper.figures import pyplot, save

# Fig. 4: DSpark's gain over DFlash in τ, math / code / chat, by block length.
PAPER_BLOCK_GAIN = {7: (16, 15, 18), 15: (30, 26, 22)}


def section_sweeps(out: list[str], figures: Path) -> None:
    result = results(out, "sweeps", "## 3. Gain over DFlash against depth and block length (Figs. 3 and 4)",
                      "benchmarks/bench_sweeps.py")
    if result is None:
        return
    points = _sweep_points(result["rows"])
    seeds = sorted({r.get("seed", 0) for r in result["rows"]})
    out.append("**How it was measured.** `benchmarks/bench_sweeps.py` trains a DSpark and a DFlash drafter at "
               f"each point on the same data for {num(result['steps'], 'd')} steps, once per seed "
               f"({num(len(seeds), 'd')} seed{'s' if len(seeds) != 1 else ''}: the seed sets initial weights and "
               "sampled anchors, not the data), and reads the held-out "
               "τ_prob = 1 + Σ_k Π_{i≤k} c*_i (c* = 1 − TV to the target's distribution, teacher-forced prefixes): "
               "the expected accepted length of T = 1 verification. Depth at γ = 7; block length at one layer. "
               f"Measured on {machine(result)}.\n")
    out.append("| sweep | layers | γ | seeds | DSpark τ_prob | DFlash τ_prob | gain in τ − 1 | DSpark ahead |")
    out.append("|---|---|---|---|---|---|---|---|")
    ahead = total = 0
    for p in points:
        if not p["gains"]:
            continue
        wins = sum(g > 0 for g in p["gains"])
        ahead, total = ahead + wins, total + len(p["gains"])
        out.append(f"| {p['sweep']} | {num(p['layers'], 'd')} | {num(p['block_size'], 'd')} | "
                   f"{num(len(p['gains']), 'd')} | {_spread(p['dspark'])} | {_spread(p['dflash'])} | "
                   f"{_spread([100 * g for g in p['gains']], '+.1f', '%')} | {num(wins, 'd')} of "
                   f"{num(len(p['gains']), 'd')} |")
    out.append("")
    out.append("Each cell is the mean over seeds with the range (min to max) in brackets; the gain in τ − 1 "
               "(accepted drafts, bonus excluded) is taken seed by seed, DSpark against the DFlash drafter of the "
               "same seed, because at τ near 1 the bonus token dilutes any difference in τ itself.")
    if total:
        widest = max(max(v) - min(v) for p in points for v in (p["dspark"], p["dflash"]))
        gaps = [abs(_mean(p["dspark"]) - _mean(p["dflash"])) for p in points if p["gains"]]
        out.append(f"DSpark is ahead in {num(ahead, 'd')} of {num(total, 'd')} paired runs. Between seeds, one "
                   f"point's τ_prob moves by up to {num(widest)}, against mean gaps between the objectives of "
                   f"{num(min(gaps))} to {num(max(gaps))}.")
    out.append("The paper's Fig. 4 reports the gain in τ of "
               + ", ".join(f"+{quote(a, 'd')}/{quote(b, 'd')}/{quote(c, 'd')}% (math/code/chat) at γ = {g}"
                           for g, (a, b, c) in PAPER_BLOCK_GAIN.items())
               + ", and Fig. 3 that a 2-layer DSpark beats a 5-layer DFlash, the largest step coming from one to "
               "two layers.\n")
    _figure_sweeps(points, figures)
    out.append("![Depth and block-length sweeps](figures/sweeps.png)\n")
    out.append("*Figure 3 (the paper's Figs. 3 and 4). Held-out τ_prob of DSpark and DFlash drafters trained "
               "identically, against the number of draft layers (left, γ = 7) and the block length γ (right, one "
               "layer): one dot per seed, the line through their means, bars from the lowest to the highest seed. "
               "The axis starts at τ = 1, no draft accepted.*\n")


def _sweep_points(rows: list[dict]) -> list[dict]:
    """Rows grouped by (sweep, layers, γ): each objective's τ_prob per seed, and DSpark's per-seed gain in
    τ − 1 over the DFlash run of the same seed. Runs of one layer at γ = 7 belong to both sweeps."""
    points = []
    for sweep, layers, gamma in dict.fromkeys((r["sweep"], r["layers"], r["block_size"]) for r in rows):
        runs = {o: {r.get("seed", 0): r["eval_tau_prob"] for r in rows if r["objective"] == o and
                    (r["layers"], r["block_size"]) == (layers, gamma)} for o in ("dspark", "dflash")}
        paired = sorted(set(runs["dspark"]) & set(runs["dflash"]))
        points.append({"sweep": sweep, "layers": layers, "block_size": gamma,
                       "dspark": [runs["dspark"][s] for s in sorted(runs["dspark"])],
                       "dflash": [runs["dflash"][s] for s in sorted(runs["dflash"])],
                       "gains": [(runs["dspark"][s] - 1) / (runs["dflash"][s] - 1) - 1 for s in paired]})
    return points


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _spread(values: list[float], spec: str = ".3f", unit: str = "") -> str:
    """"mean [min, max]" (just the value when there is one)."""
    if not values:
        return "–"
    if len(values) == 1:
        return f"{num(values[0], spec)}{unit}"
    return f"{num(_mean(values), spec)}{unit} [{num(min(values), spec)}{unit}, {num(max(values), spec)}{unit}]"


def _figure_sweeps(points: list[dict], figures: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    top = max(v for p in points for o in ("dspark", "dflash") for v in p[o])
    for ax, sweep, key, label in ((axes[0], "depth", "layers", "draft layers"),
                                  (axes[1], "block", "block_size", "block length γ")):
        members = sorted((p for p in points if p["sweep"] == sweep or (p["layers"], p["block_size"]) == (1, 7)),
                         key=lambda p: p[key])
        members = list({p[key]: p for p in members}.values())

        def moved(x, shift, log=key == "block_size"):  # the block-length axis is logarithmic
            return x * (1 + shift) if log else x + shift

        for shift, objective in ((-0.04, "dspark"), (0.04, "dflash")):
            xs = [moved(p[key], shift) for p in members]
            for p in members:  # each seed's run beside its mean, outside the other objective's bar
                ax.scatter([moved(p[key], 3 * shift)] * len(p[objective]), p[objective], s=14, alpha=0.6,
                           color=COLORS[objective], linewidths=0)
            means = [_mean(p[objective]) for p in members]
            low = [m - min(p[objective]) for m, p in zip(means, members)]
            high = [max(p[objective]) - m for m, p in zip(means, members)]
            ax.errorbar(xs, means, yerr=[low, high], marker="o", capsize=3, color=COLORS[objective],
                        label=LABELS[objective])
        ax.set_xlabel(label)
        if key == "block_size":
            ax.set_xscale("log", base=2)
        ax.set_xticks([p[key] for p in members])
        ax.set_xticklabels([str(p[key]) for p in members])
        ax.set_ylabel("held-out τ_prob (tokens per round)")
        ax.set_ylim(1.0, max(1.3, top + 0.05))  # from τ = 1 (no draft accepted): differences keep their true size
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="upper left")
    save(fig, figures, "sweeps.png")
