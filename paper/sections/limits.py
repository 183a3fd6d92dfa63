"""§8: limits: what did not reproduce, and why we think so."""

from __future__ import annotations

import math
from pathlib import Path

from paper.common import (
    DOMAINS,
    POOLS,
    acceptance_steps,
    decoded_points,
    drafter_date,
    eagle3_budget_sentence,
    late_points,
    listing,
    load,
    machine,
    num,
    pool_start_steps,
    predates_shipped_drafter,
    quote,
    training_runs,
)
from paper.provenance import group_by_commit
from paper.stats import gap_cells, paired_gap, slope_per_doubling


def train_seconds(run: dict | None) -> float | None:
    """The seconds of training over all of a drafter's runs (``None`` if a run did not record them)."""
    seconds = [(r.get("seconds") or {}).get("train") for r in training_runs(run)]
    return None if not seconds or None in seconds else sum(seconds)


def _doublings_to(last: dict, goal: float, per_doubling: float, seconds: float | None) -> str:
    """How many doublings of the tokens seen take τ_prob from the ``last`` evaluation to ``goal`` at the first
    pass's rate, and how long training that long would take at the run's pace (``seconds`` of training for the
    whole curve), as a sentence with its leading space ("" when the goal is already reached)."""
    if last["eval_tau_prob"] >= goal or per_doubling <= 0:
        return ""
    doublings = (goal - last["eval_tau_prob"]) / per_doubling
    tokens = 2 ** doublings * last["answer_tokens_seen"]
    pace = "" if not seconds else (
        f", about {num(2 ** doublings * seconds / 3600, '.0f')} hours of training at this run's pace on "
        "this CPU")
    return (f" At the first pass's rate a τ_prob of {num(goal, '.1f')} would take about {num(doublings, '.0f')} "
            f"more doublings, some {num(tokens / 1e6, '.0f')} M answer tokens seen{pace}.")


def _decoded_doublings_to(result: dict | None, goal: float, seconds: float | None) -> str:
    """The same extrapolation for greedy decoded τ, at the rate of the least-squares fit over the committed DSpark
    checkpoints (Figure 2b), as a sentence with its leading space ("" without those checkpoints or when the goal
    is reached)."""
    points = decoded_points(result).get("dspark", []) if result else []
    if len(points) < 3 or points[-1]["mean"] >= goal:
        return ""
    last, rate = points[-1], slope_per_doubling(points)
    if rate <= 0:
        return f" Decoded greedy τ (Figure 2b) has not risen with the tokens seen; it stands at {num(last['mean'])}."
    doublings = (goal - last["mean"]) / rate
    pace = "" if not seconds else (
        f", about {num(2 ** doublings * seconds / 3600, '.0f')} hours of training at this run's pace")
    late = late_points(points)
    chat = slope_per_doubling(late, lambda p: p["tau"]["chat"]) if len(late) >= 3 else None
    return (f" What a speedup rests on is decoded τ, and there the committed checkpoints gained "
            f"{num(rate, '.2f')} per doubling of the tokens seen (Figure 2b): at that rate a mean greedy τ of "
            f"{num(goal, '.1f')} would take about {num(doublings, '.0f')} more doublings, some "
            f"{num(2 ** doublings * last['tokens'] / 1e9, '.1f')} billion answer tokens seen{pace}."
            + ("" if chat is None else
               f" The later gains came from domain data added for math and code; chat gained "
               f"{num(chat, '.2f')} per doubling over the same stretch, so the mean's rate rests on finding such "
               "data for every domain."))


SEED_SPREAD = 0.01


def beside(held: float, other: float, level: str = "level with") -> str:
    """Where held-out τ_prob ``held`` lies beside ``other``: ``level`` within the seed spread, else above or below."""
    return level if abs(held - other) < SEED_SPREAD else "above" if held > other else "below"


def grew(row: dict, first: dict) -> bool:
    """Whether the generalization ``row`` is a drafter with another number of layers than the shipped ``first``."""
    return row.get("layers", first.get("layers")) != first.get("layers")


LOSS_WEIGHTS = ("ce_weight", "l1_weight")


def twin_of(row: dict, candidates: list[dict], same: tuple[str, ...]) -> dict | None:
    """The first of ``candidates`` trained like ``row`` in every setting of ``same``: the run it differs from in
    one respect only, or ``None``."""
    return next((r for r in candidates if all(r.get(k) == row.get(k) for k in same)), None)


def weights_phrase(row: dict) -> str:
    """A run's loss mix where it replaced the recipe's 0.1·CE + 0.9·L1: "cross-entropy alone" or "0.5·CE + 0.5·L1"."""
    from dspark.loss import CE_WEIGHT, L1_WEIGHT

    ce = CE_WEIGHT if row.get("ce_weight") is None else row["ce_weight"]
    l1 = L1_WEIGHT if row.get("l1_weight") is None else row["l1_weight"]
    return "cross-entropy alone" if l1 == 0 else f"{num(ce, 'g')}·CE + {num(l1, 'g')}·L1"


def generalization_bullet(result: dict, decoded: dict | None = None) -> str:
    """§8's bullet on how much better the drafters predict their training sequences than held-out ones, with a
    table of every drafter measured: the shipped one first, then its parent, its continuations and means of
    weights; ``decoded`` (``acceptance_candidates_cpu``) holds the decoding of a continuation that cleared three
    seeds' spread (:func:`decoded_sentence`)."""
    first, *others = result["rows"]
    held, train = first["held_out"], first["train"]
    pools = [f"{num(first[f'{pool}_train']['tau_prob'])} on {POOLS[pool]}" for pool in POOLS
             if f"{pool}_train" in first]
    text = (f"- **The drafter fits what it saw far better than what it did not.** With training's own evaluation "
            f"(`benchmarks/bench_generalization.py`: {num(result['samples'], 'd')} sequences a group, fixed "
            f"anchors), the {num(first['steps'], 'd')}-step DSpark drafter scores τ_prob {num(train['tau_prob'])} "
            f"on ShareGPT training sequences against {num(held['tau_prob'])} on held-out ones (CE "
            f"{num(train['ce'], '.2f')} against {num(held['ce'], '.2f')})"
            + (f", and {listing(pools)} it trained on" if pools else "") + ". It has capacity to spare for its "
            "data, which it has seen many times over. Each continuation below restarts the learning-rate schedule "
            "(warm-up, then cosine) from the shipped drafter's weights; the last column follows held-out τ_prob "
            "over that run, as training recorded it (start → lowest, at its step → end).\n")
    number = {row["drafter"]: i for i, row in enumerate(result["rows"], 1)}

    def last_run(row: dict) -> str:
        if row.get("average_of"):
            return "mean of the weights of " + listing([f"#{number[name]}" if name in number else f"`{name}`"
                                                       for name in row["average_of"]])
        if row is first:
            return "shipped"
        if row["steps"] < first["steps"]:
            return "its parent"
        parts = [f"{num(row['steps'] - first['steps'], 'd')} steps more"]
        if grew(row, first):
            parts.append(f"grown to {num(row['layers'], 'd')} layers")
        if row.get("dropout"):
            parts.append(f"dropout {num(row['dropout'], 'g')}")
        if row.get("sampled_prompts"):
            parts.append(f"{num(row['sampled_prompts'], 'd')} sampled answers (T = "
                         f"{num(row['sampled_temperature'], 'g')})")
        if row.get("followup_prompts"):
            parts.append(f"{num(row['followup_prompts'], 'd')} later ShareGPT turns")
        if row.get("lr") != first.get("lr"):
            parts.append(f"peak learning rate {num(row['lr'], 'g')}")
        if any(row.get(k) is not None for k in LOSS_WEIGHTS):
            parts.append(weights_phrase(row))
        return ", ".join(parts)

    def path(row: dict) -> str:
        curve = row.get("last_run_curve")
        if not curve or row.get("average_of"):
            return "–"
        low = min(curve, key=lambda c: c["tau_prob"])
        return (f"{num(curve[0]['tau_prob'])} → {num(low['tau_prob'])} ({num(low['step'], 'd')}) → "
                f"{num(curve[-1]['tau_prob'])}")

    lines = ["| # | drafter | its last run | held-out τ_prob | training τ_prob | gap | held-out CE | "
             "held-out τ_prob over its last run |", "|---|---|---|---|---|---|---|---|"]
    for row in result["rows"]:
        gap = row["train"]["tau_prob"] - row["held_out"]["tau_prob"]
        lines.append(f"| {number[row['drafter']]} | `{row['drafter']}` | {last_run(row)} | "
                     f"{num(row['held_out']['tau_prob'])} | {num(row['train']['tau_prob'])} | {num(gap)} | "
                     f"{num(row['held_out']['ce'], '.2f')} | {path(row)} |")
    text += "\n" + "\n".join(lines) + "\n" + measured_sentence(result, number)

    def change(row: dict, than: float) -> str:
        held = row["held_out"]["tau_prob"]
        return "left held-out τ_prob where it was" if abs(held - than) < SEED_SPREAD else \
            "raised held-out τ_prob" if held > than else "lowered held-out τ_prob"

    held_then = first["held_out"]["tau_prob"]
    continued = [r for r in others if r["steps"] > first["steps"] and not r.get("average_of")]
    if continued:
        told = [f"#{number[r['drafter']]} {change(r, held_then)} ({num(r['held_out']['tau_prob'])})"
                for r in continued]
        text += (f"\nAgainst the shipped drafter's {num(held_then)}: {listing(told)}. Dropout, new sampled text "
                 "(the ShareGPT training prompts answered again at a temperature) and new prompts (ShareGPT's later "
                 "turns, each answered alone) aim at the gap; a lower peak learning rate aims at the dip that each "
                 "restarted schedule opens first")
        grown = [r for r in continued if grew(r, first)]
        text += ("; layers grown on top aim at capacity (copies of the top layer whose output projections start at "
                 "zero, so the run starts from the shipped drafter's predictions: "
                 "`BlockBackbone.grow`).") if grown else "."
        for row in grown:
            twin = twin_of(row, [r for r in continued if r not in grown],
                           ("steps", "dropout", "sampled_prompts", "followup_prompts", *LOSS_WEIGHTS))
            if twin:
                held, twin_held = row["held_out"]["tau_prob"], twin["held_out"]["tau_prob"]
                level = beside(held, twin_held)
                rates = "" if row.get("lr") == twin.get("lr") else \
                    f" at a peak learning rate of {num(twin['lr'], 'g')} instead of {num(row['lr'], 'g')}"
                text += (f" The drafter grown to {num(row['layers'], 'd')} layers (#{number[row['drafter']]}) ends "
                         f"{level} #{number[twin['drafter']]}, the same data and length with "
                         f"{num(first['layers'], 'd')} layers{rates} (held-out τ_prob {num(held)} against "
                         f"{num(twin_held)}, training τ_prob {num(row['train']['tau_prob'])} against "
                         f"{num(twin['train']['tau_prob'])}).")
    for row in (r for r in continued if r.get("followup_prompts")):
        twin = twin_of(row, [r for r in continued if not r.get("followup_prompts")],
                       ("steps", "dropout", "sampled_prompts", "lr", "layers", *LOSS_WEIGHTS))
        if twin:
            held, twin_held = row["held_out"]["tau_prob"], twin["held_out"]["tau_prob"]
            level = beside(held, twin_held)
            text += (f" With {num(row['followup_prompts'], 'd')} later ShareGPT turns added "
                     f"(#{number[row['drafter']]}), the drafter ends {level} #{number[twin['drafter']]}, the same run "
                     f"without them (held-out τ_prob {num(held)} against {num(twin_held)}, training τ_prob "
                     f"{num(row['train']['tau_prob'])} against {num(twin['train']['tau_prob'])}).")
    reweighted = [r for r in continued if any(r.get(k) is not None for k in LOSS_WEIGHTS)]
    for row in reweighted:
        twin = twin_of(row, [r for r in continued if r not in reweighted],
                       ("steps", "dropout", "sampled_prompts", "followup_prompts", "lr", "layers"))
        if twin:
            held, twin_held = row["held_out"]["tau_prob"], twin["held_out"]["tau_prob"]
            text += (f" Trained on {weights_phrase(row)} (#{number[row['drafter']]}), the drafter ends "
                     f"{beside(held, twin_held)} #{number[twin['drafter']]}, the same run on the recipe's loss "
                     f"(held-out τ_prob {num(held)} against {num(twin_held)}, CE {num(row['held_out']['ce'], '.2f')} "
                     f"against {num(twin['held_out']['ce'], '.2f')}); τ_prob scores sampling at T = 1, which L1 "
                     "trains for, while greedy decoding accepts only the target's argmax.")
    for row in (r for r in others if r.get("average_of")):
        ingredients = [r for r in result["rows"] if r["drafter"] in row["average_of"]]
        best = max(r["held_out"]["tau_prob"] for r in ingredients)
        held = row["held_out"]["tau_prob"]
        place = beside(held, best, "within seed noise of")
        text += (f" Averaging weights (#{number[row['drafter']]}, `python -m dspark average`), which costs no "
                 f"training, scored {place} the best of its ingredients ({num(held)} against {num(best)}).")
    gain = max((r["held_out"]["tau_prob"] for r in others if r["steps"] > first["steps"]), default=None)
    if gain is not None and gain - held_then < 3 * SEED_SPREAD:
        text += (f" None of them was shipped: the best lies {num(gain - held_then)} above the shipped drafter, close "
                 "to the spread between seeds (§2) and too little to tell apart in decoding.")
    elif gain is not None:
        text += decoded_sentence(result, decoded, number)
    return text


def measured_sentence(result: dict, number: dict[str, int]) -> str:
    """Which rows of a generalization result were kept from earlier runs (``--keep``: drafters no longer on disk)
    and when those were measured, as a paragraph; empty when every row was measured in this run."""
    by_commit = group_by_commit((f"#{number[row['drafter']]}", row["measured"]) for row in result["rows"]
                                if "measured" in row)
    if not by_commit:
        return ""
    fresh = [f"#{number[row['drafter']]}" for row in result["rows"] if "measured" not in row]
    earlier = "; ".join(f"{listing(rows)} at {where}" for where, rows in by_commit.items())
    return (f"\nRows of drafters that are no longer on disk were kept from the runs that measured them "
            f"(`--keep`), on the same sequences: {earlier}; {listing(fresh)} in this run ({machine(result)}).\n")


def decoded_sentence(result: dict, decoded: dict | None, number: dict[str, int]) -> str:
    """What decoding said of the best continuation of the generalization table (``result``) once its held-out
    τ_prob cleared three seeds' spread over the shipped drafter: its greedy τ against the shipped drafter's, paired
    over prompts, and against every other row decoded beside it (``decoded``: ``acceptance_candidates_cpu``,
    drafters matched to rows by directory name). A sentence with its leading space."""
    first, *others = result["rows"]
    best = max((r for r in others if r["steps"] > first["steps"]), key=lambda r: r["held_out"]["tau_prob"])
    tag = f"#{number[best['drafter']]}"
    text = (f" The best, {tag}, clears three times the seed spread over the shipped drafter (+"
            f"{num(best['held_out']['tau_prob'] - first['held_out']['tau_prob'])}), so it was decoded before "
            "deciding whether to ship it")
    names = {Path(directory).name: name for name, directory in (decoded or {}).get("drafters", {}).items()}
    greedy = [r for r in (decoded or {}).get("rows", []) if r["temperature"] == 0]
    if best["drafter"] not in names or first["drafter"] not in names:
        return (text.replace("so it was decoded", "and is to be decoded") + " (`python benchmarks/bench_acceptance.py "
                "--drafters shipped=DIR best=DIR --temperatures 0 --name acceptance_candidates_cpu`).")

    def mean(row: dict) -> float:
        taus = [r["tau"] for r in greedy if r["drafter"] == names[row["drafter"]]]
        return sum(taus) / len(taus)

    def paired(a: dict, b: dict) -> dict[str, tuple[float, float, float]]:
        return {d: paired_gap(greedy, names[a["drafter"]], names[b["drafter"]], 0.0, d) for d in DOMAINS}

    def verdict(gaps: dict[str, tuple[float, float, float]]) -> str:
        ahead = [d for d, g in gaps.items() if g[1] > 0]
        behind = [d for d, g in gaps.items() if g[2] < 0]
        level = [d for d in gaps if d not in ahead + behind]
        parts = ([f"ahead in {listing(ahead)}"] if ahead else []) + ([f"behind in {listing(behind)}"] if behind
                                                                    else [])
        if level:
            parts.append(f"level in {listing(level)}" if parts else "level in every domain")
        return ", ".join(parts)

    against_shipped = paired(best, first)
    text += (f": greedy, every slot verified, {num(greedy[0]['prompts'], 'd')} held-out prompts a domain and "
             f"{num(decoded['max_new_tokens'], 'd')} new tokens (`acceptance_candidates_cpu`), it reaches τ "
             f"{num(mean(best))} on average against the shipped drafter's {num(mean(first))}, "
             f"{verdict(against_shipped)} (τ difference paired over prompts, with its 95% bootstrap interval: "
             f"{gap_cells(against_shipped)}).")
    for row in (r for r in others if r is not best and r["drafter"] in names):
        against_row = paired(best, row)
        text += (f" #{number[row['drafter']]} (held-out τ_prob {num(row['held_out']['tau_prob'])}), decoded beside "
                 f"them, reaches {num(mean(row))}; against it {tag} is {verdict(against_row)} "
                 f"({gap_cells(against_row)}).")
    tags = {name: f"#{number[directory]}" for directory, name in names.items() if directory in number}
    by_commit = group_by_commit((tags.get(name, f"`{name}`"), provenance)
                                for name, provenance in decoded.get("reused", {}).items())
    if by_commit:
        text += (" The rows of " + "; ".join(f"{listing(rows)} are those decoded at {where}"
                                             for where, rows in by_commit.items())
                 + ", on the same prompts with the same settings (`--reuse`, `--keep`).")
    return text + (f" The shipped drafter stays: what {tag} gained on held-out sequences shows in decoding as "
                   f"{num(mean(best) - mean(first), '+.3f')} τ on average.")


def grown_sentence(general: dict | None) -> str:
    """What the generalization rows say of a layer grown onto the shipped drafter, as a sentence with its leading
    space ("" when no row grew one)."""
    if general is None:
        return ""
    first, *others = general["rows"]
    grown = [r for r in others if grew(r, first) and not r.get("average_of")]
    if not grown:
        return ""
    best = max(grown, key=lambda r: r["held_out"]["tau_prob"])
    gain = best["held_out"]["tau_prob"] - first["held_out"]["tau_prob"]
    if gain >= 3 * SEED_SPREAD:
        return ""
    return (f" Growing layers onto the shipped drafter did not pay: at {num(best['layers'], 'd')} layers and "
            f"{num(best['steps'] - first['steps'], 'd')} steps more it reached held-out τ_prob "
            f"{num(best['held_out']['tau_prob'])} against {num(first['held_out']['tau_prob'])} (below), so more "
            "layers would mean training from scratch as well.")


def section_limits(out: list[str]) -> None:
    out.append("## 8. Limits: what did not reproduce, and why we think so\n")
    acceptance, recipe, e2e = load("acceptance_cpu"), load("training_recipe"), load("e2e_cpu")
    general = load("generalization_cpu")
    if acceptance is not None and recipe is not None:
        greedy = {r["domain"]: r["tau"] for r in acceptance["rows"] if r["drafter"] == "dspark"
                  and r["temperature"] == 0}
        curve = recipe["arms"]["dspark"]["curve"]
        seconds = train_seconds(recipe["arms"]["dspark"].get("run"))
        first_epoch = [c for c in curve if 0 < c["answer_tokens_seen"] <= recipe["regeneration"]["answer_tokens"]]
        lo, hi = first_epoch[0], first_epoch[-1]
        per_doubling = (hi["eval_tau_prob"] - lo["eval_tau_prob"]) / math.log2(hi["answer_tokens_seen"]
                                                                                / lo["answer_tokens_seen"])
        starts = pool_start_steps(recipe["arms"]["dspark"].get("run"))
        added_from = min(starts.values(), default=None)
        repeated = [c for c in curve if c["answer_tokens_seen"] > recipe["regeneration"]["answer_tokens"]
                    and (added_from is None or c["step"] <= added_from)]
        second_pass = ""
        if repeated:
            last = repeated[-1]
            again = (last["eval_tau_prob"] - hi["eval_tau_prob"]) / math.log2(last["answer_tokens_seen"]
                                                                               / hi["answer_tokens_seen"])
            # Within a fifth of the first pass's rate counts as "about as much": the rates are two-point slopes.
            verdict = "about as much as" if again >= 0.8 * per_doubling else "less than"
            second_pass = (f" Going on over the same sequences again, to step {num(last['step'], 'd')} "
                           f"({num(last['answer_tokens_seen'] / 1e3, '.0f')}k answer tokens seen), took it to "
                           f"{num(last['eval_tau_prob'])}: about {num(again, '.2f')} per doubling of the tokens "
                           f"seen, so at this scale repeated sequences teach {verdict} new ones did.")
        if added_from is not None and curve[-1]["step"] > added_from:
            added = listing([f"{POOLS[pool]} from step {num(step, 'd')}" for pool, step in starts.items()])
            second_pass += (f" With {added} added to its data (§2), it reached {num(curve[-1]['eval_tau_prob'])} "
                            f"at step {num(curve[-1]['step'], 'd')} on the same held-out ShareGPT sequences.")
        subject = "The shipped DSpark drafter decodes"
        if predates_shipped_drafter(acceptance):
            subject = (f"The DSpark drafter at {acceptance_steps(acceptance)} steps (§1, not re-measured for the "
                       "shipped one) decoded")
        out.append(f"- **Acceptance is the limit.** {subject} with τ "
                   f"{num(sum(greedy.values()) / len(greedy))} on average at T = 0 (math {num(greedy['math'])}): far "
                   "from what a speedup on this CPU needs (below). Over its first pass through the data, "
                   f"its held-out τ_prob rose from {num(lo['eval_tau_prob'])} at "
                   f"{num(lo['answer_tokens_seen'] / 1e3, '.0f')}k answer tokens to {num(hi['eval_tau_prob'])} at "
                   f"{num(hi['answer_tokens_seen'] / 1e3, '.0f')}k: about {num(per_doubling, '.2f')} per doubling "
                   "of the data." + second_pass + _doublings_to(curve[-1], 2.5, per_doubling, seconds)
                   + _decoded_doublings_to(load("acceptance_curve_cpu"), 2.5, seconds)
                   + " The paper's "
                   f"drafters have five layers and see {quote(1.3)} M samples {quote(10, 'd')} times. This recipe "
                   "already took the paper's largest step, from one draft layer to two; the levers left are more "
                   "layers and much longer training, which a GPU makes cheap." + grown_sentence(general))
    if general is not None:
        out.append(generalization_bullet(general, load("acceptance_candidates_cpu")))
    if e2e is not None:
        def e2e_row(batch: int, scheduler: str, batching: str = "static") -> dict | None:
            return next((r for r in e2e["rows"] if r["batch"] == batch and r["scheduler"] == scheduler
                         and r.get("batching", "static") == batching), None)

        every, planned = e2e_row(1, "every slot"), e2e_row(1, "algorithm-1")
        four, four_every = e2e_row(4, "algorithm-1"), e2e_row(4, "every slot")
        continuous = e2e_row(4, "algorithm-1", "continuous")
        parts = every["round_parts_in_target_steps"]

        def pays(row: dict) -> str:
            return "faster than" if row["speedup"] > 1 else "slower than"

        out.append("- **Speed on a CPU.** Verifying every slot, a round costs "
                   f"{num(every['round_in_target_steps'], '.2f')} plain target steps at batch 1 "
                   f"({num(parts['target'], '.2f')} of them the verify pass of γ + 1 tokens, "
                   f"{num(parts['draft'], '.2f')} the draft) against its τ of {num(every['tau'])}, so it is "
                   f"{pays(every)} the target alone ({num(every['speedup'], '.2f')}×). Algorithm 1 sends only the "
                   "drafts that pay on the verify-latency profile it measured (§6), "
                   f"{num(planned['rounds_without_drafts'], 'd')} of {num(planned['rounds'], 'd')} rounds none at "
                   f"all (τ {num(planned['tau'])}): one request then decodes at {num(planned['speedup'], '.2f')}× "
                   f"the target alone, with identical outputs. At batch 4 a verify pass of every slot costs "
                   f"{num(four_every['round_parts_in_target_steps']['target'], '.2f')} steps, and Algorithm 1 reaches "
                   f"{num(four['speedup'], '.2f')}× (τ {num(four['tau'])})"
                   + (f"; with continuous batching, which keeps four requests running where a static batch ends "
                      f"with its stragglers, {num(continuous['speedup'], '.2f')}× the target alone batched the "
                      f"same way (τ {num(continuous['tau'])}, a round "
                      f"{num(continuous['round_in_target_steps'], '.2f')} steps; the target alone gains from it "
                      f"too, {num(continuous['target_only_tokens_per_s'], '.1f')} against "
                      f"{num(four['target_only_tokens_per_s'], '.1f')} tokens/s)" if continuous else "")
                   + ". A speedup worth the name needs a higher τ: "
                   "the round's fixed costs (the draft, and a verify pass that costs a bit more than a plain step) "
                   "are paid back only by accepted tokens.")
    recipe = load("training_recipe", cited=False)
    out.append(f"- {eagle3_budget_sentence(recipe['arms'] if recipe else {})}§2 lists the data and recipe each arm "
               "was actually trained with.")
    shipped = drafter_date()
    # The sweeps (§3) train drafters of their own, so a newer shipped drafter leaves them as they were.
    stale = [what for what, name in (("calibration (§4)", "calibration_cpu"),
                                     ("the scheduler study's trained pool (§5)", "scheduler"),
                                     ("the scheduler study's whole decodes (§5)", "scheduler_measured_cpu"))
             if shipped and load(name, False) and load(name, False)["environment"]["date"] < shipped]
    if stale:
        listed = stale[0] if len(stale) == 1 else ", ".join(stale[:-1]) + " and " + stale[-1]
        verb, state = ("rests", "is") if len(stale) == 1 else ("rest", "are")
        out.append(f"- {listed[0].upper() + listed[1:]} {verb} on the earlier drafter and {state} marked stale. "
                   "The synthetic paper-profile pool in §5 shows what the policies do when drafts are accepted as "
                   "often as in the paper.")
    out.append("- The scheduler's serving-shaped table (§5) is a roofline model of an H200 built from one measured "
               "number (its copy bandwidth) and the datasheet bf16 peak; no engine with CUDA graphs was profiled, "
               "so its knee, and with it Algorithm 1's lead at high load, are only as good as that model.")
    out.append("- STS (§4) is fitted on other prompts than it is judged on; with few accepted rounds at later "
               "positions its temperatures there rest on little data, and the out-of-sample effect is mixed, as "
               "other implementers report (method.md §5.2 describes the fit).")
    out.append("- GPU numbers come from short leases on one card; Blackwell configs are compiled and inspected "
               "(§6) but were never run.\n")
