"""§1: accepted length per domain (Table 1 at small scale)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from paper.common import (
    COLORS,
    DOMAINS,
    EARLIER,
    POOLS,
    ROOT,
    acceptance_steps,
    continuation_sentence,
    draft_layers,
    eagle3_budget_sentence,
    label,
    listing,
    load,
    machine,
    num,
    pool_counts,
    pools_in,
    quote,
    recipe_difference,
    results,
    stale_note,
    training_runs,
)
from paper.figures import pyplot, save
from paper.provenance import group_by_commit
from paper.stats import gap_cells, paired_gap

# The DSpark paper, Table 1, Qwen3-4B, T = 1: τ including the bonus token.
PAPER_TAU = {"eagle3": {"math": 5.14, "code": 4.16, "chat": 2.39},
             "dflash": {"math": 5.40, "code": 4.74, "chat": 3.07},
             "dspark": {"math": 6.11, "code": 5.38, "chat": 3.64}}


def shipped_pools_clause(meta: dict) -> str:
    """What the shipped DSpark drafter trained on beside ShareGPT, as a parenthesis, or ""."""
    pools = pools_in(meta)
    return f" (the shipped DSpark drafter's later training also on {listing([POOLS[p] for p in pools])})" \
        if pools else ""


def loss_difference(arguments: dict) -> str:
    """A sentence when a DSpark drafter was trained on other loss weights than the recipe's, or ""."""
    weights = {k: arguments.get(k) for k in ("ce_weight", "l1_weight")}
    if all(v is None for v in weights.values()):
        return ""
    from dspark.loss import CE_WEIGHT, L1_WEIGHT

    ce = CE_WEIGHT if weights["ce_weight"] is None else weights["ce_weight"]
    l1 = L1_WEIGHT if weights["l1_weight"] is None else weights["l1_weight"]
    return (f" Its loss weighs cross-entropy by {num(ce, 'g')} and L1 by {num(l1, 'g')}, where the recipe weighs "
            f"them by {num(CE_WEIGHT, 'g')} and {num(L1_WEIGHT, 'g')}.")


def committed_recipe() -> dict:
    return json.loads((ROOT / "benchmarks" / "recipes" / "smollm2_drafter.json").read_text(encoding="utf-8"))


def reused_sentence(result: dict) -> str:
    """Which drafters' rows an acceptance run kept from an earlier run (``--reuse``) and when those were decoded,
    followed by a space; empty when every drafter was decoded in this run."""
    by_commit = group_by_commit((label(name), provenance) for name, provenance in result.get("reused", {}).items())
    if not by_commit:
        return ""
    # Labels can hold commas ("DSpark, CE only"), so the drafters of one commit are listed with semicolons.
    kept = " ".join(f"At {where}: {'; '.join(names)}." for where, names in by_commit.items())
    return (f"Drafters that did not change since an earlier run were not decoded again; their rows are that run's "
            f"(`--reuse`), decoded on the same prompts with the same settings. {kept} ")


def section_acceptance(out: list[str], figures: Path) -> None:
    result = results(out, "acceptance_cpu", "## 1. Accepted length per domain (Table 1 at small scale)",
                      "benchmarks/bench_acceptance.py")
    if result is None:
        return
    rows = result["rows"]
    drafters = list(dict.fromkeys(r["drafter"] for r in rows))
    out.append("**How it was measured.** `benchmarks/bench_acceptance.py`: target SmolLM2-135M-Instruct; "
               f"{num(rows[0]['prompts'], 'd')} held-out prompts per domain (GSM8K, HumanEval, MT-Bench first "
               f"turns, none in the training pool), {num(result['max_new_tokens'], 'd')} new tokens, every drafted "
               "slot verified (no scheduler); τ counts the bonus token. The drafters were trained by the recipe of §2 "
               "on target-answered ShareGPT sequences with γ = 7"
               + shipped_pools_clause(result.get("drafter_metadata", {}).get("dspark") or {})
               + "; each one's layers, steps and data are listed "
               f"below the table. {eagle3_budget_sentence(result.get('drafter_metadata', {}))}"
               f"{reused_sentence(result)}Measured on {machine(result)}.\n")
    out.append(stale_note(result, f"the drafters of {acceptance_steps(result)} steps"))
    out.append("| drafter | T | math τ | code τ | chat τ | paper (Qwen3-4B, T = 1): GSM8K / HumanEval / MT-Bench |")
    out.append("|---|---|---|---|---|---|")
    for name in drafters:
        for temperature in sorted({r["temperature"] for r in rows}):
            cells = {r["domain"]: r for r in rows if r["drafter"] == name and r["temperature"] == temperature}
            paper = PAPER_TAU.get(name)
            quoted_cell = " / ".join(quote(paper[d], ".2f") for d in DOMAINS) if paper and temperature == 1 else ""
            out.append(f"| {label(name)} | {num(temperature, 'g')} | "
                       + " | ".join(num(cells[d]["tau"]) for d in DOMAINS) + f" | {quoted_cell} |")
    out.append("")
    meta = result.get("drafter_metadata", {})
    recipe = committed_recipe()
    recorded = (load("training_recipe", cited=False) or {}).get("arms", {})
    for name in drafters:
        final = meta.get(name, {}).get("final", {})
        if final:
            run = meta[name].get("run") or {}
            arguments = (training_runs(run) or [{}])[0].get("arguments", {})
            ran = (run.get("train_config") or {}).get("precision")
            out.append(f"- {label(name)}: {draft_layers(arguments)}, "
                       f"{num(meta[name].get('steps'), 'd')} steps on "
                       f"{num(meta[name].get('train_sequences'), 'd')} sequences"
                       + (f" ({pool_counts(meta[name])})" if pools_in(meta[name]) else "")
                       + (f" in {ran}" if ran else "")
                       + "; held-out τ_prob "
                       f"{num(final.get('eval_tau_prob', float('nan')))} at the last evaluation."
                       + recipe_difference(arguments, recipe) + continuation_sentence(run)
                       + loss_difference(arguments) + _other_run(name, final, recorded))
    out.append("")
    order = _ranking(rows, 1.0)
    if order:
        out.append(f"At T = 1 the order by mean τ over the three domains is {order} (the paper: DSpark > DFlash > "
                   "EAGLE-3 on Qwen3 targets).\n")
    dspark = _at_budget_of(meta, drafters, "dflash")
    cells = _paired_cells(rows, dspark, "dflash")
    if cells:
        out.append(f"The τ of {label(dspark)} minus DFlash's, paired over the same prompts, with a 95% bootstrap "
                   f"interval that resamples prompts: at T = 0 {cells[0.0]}; at T = 1 {cells[1.0]}. At T = 0 both "
                   "decode the target's greedy output, so only acceptance differs; at T = 1 the sampled outputs "
                   "differ too. An interval that contains 0 means these prompts cannot tell the two drafters apart."
                   + _unequal_budget(meta, dspark, "dflash") + "\n")
    longer = _paired_cells(rows, "dspark", dspark) if dspark != "dspark" else None
    if longer:
        out.append(f"What training past DFlash's budget adds, DSpark ({num(meta['dspark']['steps'], 'd')} steps, "
                   f"the shipped drafter) minus {label(dspark)}, on the same "
                   + ("ShareGPT sequences, the shipped one's later training with "
                      + listing([POOLS[pool] for pool in pools_in(meta["dspark"])]) + " added"
                      if pools_in(meta["dspark"]) else "sequences")
                   + f": at T = 0 {longer[0.0]}; at "
                   f"T = 1 {longer[1.0]}.\n")
    heads, l1_term = _paired_cells(rows, "dspark-ce", "dflash"), _paired_cells(rows, dspark, "dspark-ce")
    if heads and l1_term:
        out.append("DSpark differs from DFlash in two ways: its Markov and confidence heads, and its loss (L1 to the "
                   "target's distribution, mostly, where DFlash has cross-entropy). The DSpark drafter trained on "
                   "cross-entropy alone (*DSpark, CE only*: the same data, steps and recipe otherwise) separates them. "
                   f"What the heads add, DSpark CE only minus DFlash: at T = 0 {heads[0.0]}; at T = 1 {heads[1.0]}."
                   + _unequal_budget(meta, "dspark-ce", "dflash") + f" What the L1 term adds, {label(dspark)} minus "
                   f"DSpark CE only: at T = 0 {l1_term[0.0]}; at T = 1 {l1_term[1.0]}."
                   + _unequal_budget(meta, dspark, "dspark-ce") + " L1 rewards a draft distribution close to the "
                   "target's everywhere, which is what acceptance under sampling pays for; greedy verification "
                   "accepts a slot only when the drafter's argmax is the target's, which cross-entropy trains "
                   "directly.\n")
    _repeat_table(out, rows)
    _agreement_paragraph(out)
    _figure_acceptance(rows, figures)
    out.append("![Conditional acceptance by position](figures/acceptance_by_position.png)\n")
    out.append("*Figure 1 (the paper's Fig. 2). Conditional acceptance of slot k given slots 1..k−1 were accepted, "
               "per domain, at T = 1 (solid) and T = 0 (dashed). Points past slot 2 rest on few rounds. The paper "
               f"reports {quote(0.88)} vs {quote(0.81)} at slot 1 on math for DFlash vs EAGLE-3, "
               f"{quote(0.72)} vs {quote(0.53)} on chat, and DSpark starting at {quote(0.93)} on math.*\n")


def _agreement_paragraph(out: list[str]) -> None:
    """Decoding against teacher forcing at the same anchors (``agreement_cpu``), if measured."""
    result = load("agreement_cpu")
    if result is None:
        return
    rows = result["rows"]
    slots = sum(r["drafted_slots"] for r in rows)
    agreement = sum(r["agreement"] * r["drafted_slots"] for r in rows) / slots
    out.append(f"**Decoding drafts what training scores.** `benchmarks/bench_agreement.py` decoded "
               f"{num(rows[0]['prompts'], 'd')} prompts per group greedily with the fp32 target "
               f"({num(result['max_new_tokens'], 'd')} new tokens, every slot verified) and replayed every drafted "
               f"block under teacher forcing at the same anchor: {num(100 * agreement, '.2f')}% of "
               f"{num(slots, 'd')} drafted slots are the teacher-forced argmax. Decoded first-slot acceptance sits "
               "below training's evaluation for two other reasons, shown per group as slot-1 accuracy under "
               "teacher forcing at every answer token, at the anchors the decoding rounds started from, and "
               "decoded:\n")
    out.append("| prompts | every answer token | rounds' anchors | decoded |")
    out.append("|---|---|---|---|")
    for r in rows:
        out.append(f"| {r['group']} | {num(r['teacher_forced_slot1_all'], '.3f')} | "
                   f"{num(r['teacher_forced_slot1_at_rounds'], '.3f')} | {num(r['decoded_slot1'], '.3f')} |")
    out.append("")
    by_group = {r["group"]: r for r in rows}
    trained_on = by_group.get("sharegpt-held-out")
    domains = [r for r in rows if r["group"] in DOMAINS]
    shift = trained_on is not None and domains and all(
        r["teacher_forced_slot1_all"] < trained_on["teacher_forced_slot1_all"] for r in domains)
    harder = [r["group"] for r in rows if r["teacher_forced_slot1_at_rounds"] < r["teacher_forced_slot1_all"] - 0.01]
    out.append(("The held-out ShareGPT prompts are the distribution the drafter was trained on; every evaluation "
                "domain scores below them at every answer token. " if shift else "")
               + "A round starts where the previous one stopped, after a rejection at the token the target put in "
               "place of a wrong draft, so its anchor need not be a typical answer token: the rounds' anchors "
               + (f"are more than 0.01 harder in {num(len(harder), 'd')} of {num(len(rows), 'd')} groups "
                  f"({', '.join(harder)})" if harder else "are no harder than the average token in any group")
               + ".\n")


def _paired_cells(rows: list[dict], a: str, b: str) -> dict[float, str] | None:
    """Per temperature (0 and 1), "math +x [lo, hi]; code ...; chat ..." for drafter ``a``'s τ minus ``b``'s
    (:func:`paired_gap`); None unless every domain at both temperatures has per-prompt counts for both."""
    gaps = {t: {d: paired_gap(rows, a, b, t, d) for d in DOMAINS} for t in (0.0, 1.0)}
    if not all(g for by_domain in gaps.values() for g in by_domain.values()):
        return None
    return {t: gap_cells(by_domain) for t, by_domain in gaps.items()}


def _at_budget_of(meta: dict, drafters: list[str], other: str) -> str:
    """The DSpark drafter to compare with drafter ``other`` (``meta``: drafter metadata by name): the shipped
    one, unless it trained for more steps than ``other`` and an earlier checkpoint of it at ``other``'s steps
    (``dspark-steps<N>``) was decoded too."""
    steps = meta.get(other, {}).get("steps")
    if steps is None or meta.get("dspark", {}).get("steps") == steps:
        return "dspark"
    earlier = f"dspark-steps{steps}"
    return earlier if earlier in drafters and meta.get(earlier, {}).get("steps") == steps else "dspark"


def _unequal_budget(meta: dict, a: str, b: str) -> str:
    """A sentence when drafters ``a`` and ``b`` were trained for different numbers of steps (``meta``: drafter
    metadata by name), else ""."""
    steps = {name: meta.get(name, {}).get("steps") for name in (a, b)}
    if None in steps.values() or steps[a] == steps[b]:
        return ""
    return (f" {label(a)} was trained for {num(steps[a], 'd')} steps and {label(b)} for "
            f"{num(steps[b], 'd')}, so these gaps are not at equal training budget.")


def _repeat_table(out: list[str], rows: list[dict]) -> None:
    """How often each drafter's slot k drafts the token of slot k − 1 at T = 0, pooled over domains by blocks
    drafted, against how often the target's greedy output repeats its previous token; nothing for results that
    predate the count."""
    greedy = [r for r in rows if r["temperature"] == 0 and "draft_repeat_rate" in r]
    if not greedy:
        return
    gamma = len(greedy[0]["draft_repeat_rate"]) + 1
    out.append("The share of drafted blocks in which slot k repeats the token drafted in slot k − 1, at T = 0 "
               "(verified or not, the three domains pooled). Slots drafted in one parallel pass "
               "fall back on the same likely token when the drafter is unsure; DSpark's Markov head conditions "
               "each slot on the one before, and the EAGLE-3-style chain drafts one token at a time.\n")
    out.append("| drafter | " + " | ".join(f"slot {k}" for k in range(2, gamma + 1)) + " |")
    out.append("|---|" + "---|" * (gamma - 1))
    for name in dict.fromkeys(r["drafter"] for r in greedy):
        mine = [r for r in greedy if r["drafter"] == name]
        blocks = sum(r["drafted_blocks"] for r in mine)
        rates = [sum(r["draft_repeat_rate"][k] * r["drafted_blocks"] for r in mine) / blocks for k in range(gamma - 1)]
        out.append(f"| {label(name)} | " + " | ".join(num(x, ".2f") for x in rates) + " |")
    target = [r["output_repeat_rate"] for r in greedy if r["drafter"] == greedy[0]["drafter"]]
    out.append(f"\nThe target's own greedy answers to these prompts repeat their previous token "
               f"{num(100 * min(target), '.1f')}–{num(100 * max(target), '.1f')}% of the time, depending on "
               "the domain.\n")


def _other_run(name: str, final: dict, recorded: dict) -> str:
    """A note when §2 records a different training run of drafter ``name`` than the one decoded here."""
    if name not in recorded or (recorded[name].get("final") or {}).get("eval_tau_prob") == final.get("eval_tau_prob"):
        return ""
    return (" §2 records another run of its recipe (held-out τ_prob "
            f"{num(recorded[name]['final']['eval_tau_prob'])}); the one decoded here is the one committed.")


def _ranking(rows: list[dict], temperature: float) -> str:
    means = {}
    for name in dict.fromkeys(r["drafter"] for r in rows):
        taus = [r["tau"] for r in rows if r["drafter"] == name and r["temperature"] == temperature]
        if len(taus) == len(DOMAINS):
            means[name] = sum(taus) / len(taus)
    ranked = sorted(means, key=means.get, reverse=True)
    return " > ".join(f"{label(n)} ({num(means[n])})" for n in ranked)


def _wilson(successes: int | None, trials: int | None, z: float = 1.96) -> tuple[float, float] | None:
    """The 95% Wilson score interval of a proportion, or None without counts."""
    if successes is None or not trials:
        return None
    p = successes / trials
    centre = (p + z * z / (2 * trials)) / (1 + z * z / trials)
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / (1 + z * z / trials)
    # The interval holds p exactly; at p = 0 or 1 rounding can put a bound a hair on the wrong side of it.
    return max(0.0, min(p, centre - half)), min(1.0, max(p, centre + half))


def _figure_acceptance(rows: list[dict], figures: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.4), sharey=True)
    gamma = len(rows[0]["conditional_acceptance"])
    for ax, domain in zip(axes, DOMAINS):
        for r in rows:
            if r["domain"] != domain or EARLIER.fullmatch(r["drafter"]):
                continue  # an earlier checkpoint of an arm would draw over the arm itself
            # 95% Wilson intervals from the rounds behind each point; slots reached by no round are left out.
            reached = r.get("reached_by_position") or [None] * gamma
            accepted = r.get("accepted_by_position") or [None] * gamma
            pts = [(k + 1, v, _wilson(a, n)) for k, (v, a, n) in enumerate(zip(r["conditional_acceptance"],
                                                                              accepted, reached))
                   if v == v and (n is None or n > 0)]
            style = dict(marker="o", color=COLORS.get(r["drafter"]), linestyle="-" if r["temperature"] == 1 else "--",
                         label=f"{label(r['drafter'])} T={r['temperature']:g}", capsize=2)
            errors = [[p[1] - p[2][0] for p in pts], [p[2][1] - p[1] for p in pts]] if all(p[2] for p in pts) \
                else None
            ax.errorbar([p[0] for p in pts], [p[1] for p in pts], yerr=errors, **style)
        ax.set_title(domain)
        ax.set_xticks(range(1, gamma + 1))
        ax.set_xlabel("draft slot k")
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("P(accept slot k | slots 1..k−1 accepted)")
    axes[-1].legend(fontsize=7)
    save(fig, figures, "acceptance_by_position.png")
