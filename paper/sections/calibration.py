"""§4: calibration before and after STS (Fig. 6)."""

from __future__ import annotations

import math
from pathlib import Path

from paper.common import machine, num, quote, results, stale_note
from paper.figures import pyplot, save

# Fig. 6, Alpaca, Qwen3-4B: ECE (%) before → after STS at positions 1, 3, 5, 7.
PAPER_ECE = {1: (5.7, 2.0), 3: (8.2, 1.7), 5: (5.8, 0.8), 7: (3.3, 0.4)}


def section_calibration(out: list[str], figures: Path) -> None:
    result = results(out, "calibration_cpu", "## 4. Calibration before and after STS (Fig. 6)",
                      "benchmarks/bench_calibration.py")
    if result is None:
        return
    out.append("**How it was measured.** `benchmarks/bench_calibration.py`: the trained DSpark drafter decodes "
               "held-out prompts at T = 1 with every slot verified, recording its raw confidence logits and the "
               f"accepted prefix. STS is fitted on {num(result['fit_rounds'], 'd')} rounds of "
               f"{num(result['fit_prompts'], 'd')} prompts and evaluated on {num(result['eval_rounds'], 'd')} rounds "
               f"of {num(result['eval_prompts'], 'd')} other prompts, so the after column is out of sample. "
               "Per position k the prediction is the survival a_k = Π_{i≤k} σ(z_i/T_i) and the label "
               f"1[k ≤ A]; ECE over {num(result['ece_bins'], 'd')} equal bins. Measured on {machine(result)}.\n")
    out.append(stale_note(result, "the earlier drafter"))
    out.append("| position | rounds | ECE before | ECE after | AUROC | T_k | paper ECE before → after |")
    out.append("|---|---|---|---|---|---|---|")
    before, after = result["before"], result["after"]
    for k in range(len(before["ece"])):
        paper = PAPER_ECE.get(k + 1)
        quoted_cell = f"{quote(paper[0], '.1f')}% → {quote(paper[1], '.1f')}%" if paper else ""
        out.append(f"| {k + 1} | {num(before['count'][k], 'd')} | {_pct(before['ece'][k])} | {_pct(after['ece'][k])} "
                   f"| {_maybe(before['auroc'][k])} | {num(result['temperatures'][k], '.2f')} | {quoted_cell} |")
    out.append("")
    _figure_reliability(result, figures)
    out.append("![Reliability diagrams](figures/reliability.png)\n")
    out.append("*Figure 4 (the paper's Fig. 6). Reliability of the survival a_k at the first four positions, "
               "before (raw head) and after STS, on the evaluation rounds; marker area grows with the bin's count. "
               "The diagonal is perfect calibration. Later positions have almost no accepted rounds here.*\n")


def _pct(value: float) -> str:
    return "n/a" if value != value else num(100 * value, ".1f") + "%"


def _maybe(value: float) -> str:
    return "n/a" if value != value else num(value)


def _figure_reliability(result, figures: Path) -> None:
    plt = pyplot()
    # Positions whose rounds never accepted that far have nothing to show: only the first four with data.
    shown = [k for k, d in enumerate(result["diagram_before"]) if any(f > 0 for f, c in zip(d["frequency"], d["count"])
                                                                      if c)][:4]
    fig, axes = plt.subplots(1, len(shown), figsize=(3.1 * len(shown), 3.2), sharey=True, squeeze=False)
    for k, ax in zip(shown, axes[0]):
        for key, color, label in (("diagram_before", "tab:gray", "before STS"), ("diagram_after", "tab:red",
                                                                                 "after STS")):
            d = result[key][k]
            pts = [(p, f, c) for p, f, c in zip(d["mean_prediction"], d["frequency"], d["count"]) if c]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], color=color, marker=None, alpha=0.7)
            ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=[8 + 4 * math.sqrt(p[2]) for p in pts],
                       color=color, label=label)
        ax.plot([0, 1], [0, 1], color="black", linewidth=0.8, linestyle=":")
        ax.set_title(f"position {k + 1}")
        ax.set_xlabel("predicted survival a_k")
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("observed frequency of k ≤ A")
    axes[0][0].legend(fontsize=8)
    save(fig, figures, "reliability.png")
