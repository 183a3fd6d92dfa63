"""§2: training at small scale: data, speed and acceptance against data."""

from __future__ import annotations

import json
from pathlib import Path

from paper.common import (
    COLORS,
    DOMAINS,
    POOLS,
    ROOT,
    continuation_sentence,
    decoded_points,
    draft_layers,
    label,
    late_points,
    listing,
    load,
    machine,
    num,
    pool_counts,
    pool_start_steps,
    pools_in,
    recipe_difference,
    results,
    training_runs,
)
from paper.figures import pyplot, save
from paper.stats import slope_per_doubling

# The recipe every arm's drafter was trained by (its arms name the baselines).
RECIPE = ROOT / "benchmarks" / "recipes" / "smollm2_drafter.json"


POOL_ANSWERS = {"code": "code answers", "math": "math answers", "math2": "second-series math answers",
                "math3": "third-series math answers", "code2": "second-series code answers",
                "sampled": "sampled ShareGPT answers", "followup": "later-turn ShareGPT answers"}


def recipe_command() -> str:
    """The command that trains an arm: the recipe, with one of its arms named for a baseline."""
    arms = json.loads(RECIPE.read_text(encoding="utf-8")).get("arms", {})
    return (f"`python -m dspark train --config {RECIPE.relative_to(ROOT)}"
            + (f" [--arm {' | '.join(arms)}]`" if arms else "`"))


def phases_clause(arms: dict) -> str:
    """How many of the recipe's phases each arm ran, as a clause, or "" when none ran more than one."""
    runs = {name: len(training_runs(arm.get("run"))) for name, arm in arms.items()}
    if max(runs.values(), default=1) <= 1:
        return ""
    return (", each phase continuing the drafter the phase before it wrote (phases run: "
            + "; ".join(f"{label(name)} {n}" for name, n in runs.items()) + ")")


def wall_clock(run: dict) -> str:
    """One training run's timed phases and the threads it ran on, e.g. "train 54.0 min on 2 threads"."""
    seconds = run.get("seconds", {})
    # The corpus phase of each run only found a corpus on disk; building one is timed under Data.
    phases = ", ".join(f"{k} {num(seconds[k] / 60, '.1f')} min" for k in ("train", "calibrate") if k in seconds)
    # Runs from before the thread count was recorded ran one per core, side by side.
    threads = run.get("threads", 1)
    return f"{phases} on " + ("one CPU core" if threads == 1 else f"{num(threads, 'd')} threads")


def section_training(out: list[str], figures: Path) -> None:
    result = results(out, "training_recipe", "## 2. Training at small scale: data, speed and acceptance against data",
                      "benchmarks/bench_recipe.py")
    if result is None:
        return
    regen, arms, recipe = result["regeneration"], result["arms"], result["recipe"]
    out.append("**How it was measured.** One command per arm, " + recipe_command()
               + phases_clause(arms)
               + ", on this CPU; "
               "`benchmarks/bench_recipe.py` collects what the runs recorded. "
               f"Measured on {machine(result)}.\n")
    pool = regen["settings"]["num_prompts"]
    answered = f"all {num(pool, 'd')}" if recipe["corpus_samples"] is None else \
        f"the first {num(recipe['corpus_samples'], 'd')} of a seeded shuffle of {num(pool, 'd')}"
    out.append(f"- **Data.** The bf16 target answered {answered} ShareGPT first turns greedily "
               f"(at most {num(recipe['max_new_tokens'], 'd')} new tokens): {num(regen['answer_tokens'], 'd')} answer "
               f"tokens, with the target's features kept as it read them. Regeneration ran at "
               f"{num(regen['tokens_per_s'], '.0f')} answer tokens/s (over the "
               f"{num(regen.get('timed_answer_tokens', regen['answer_tokens']), 'd')} tokens of the runs that "
               f"recorded their time; batches of {num(regen['batch_size'], 'd')}, "
               f"prefill and feature writes included, sharing the CPU with other work at times), "
               f"{num(regen['speedup_over_batch1'], '.1f')}× plain batch-1 generation by the same target "
               f"({num(regen['batch1_generate_tokens_per_s'], '.1f')} tokens/s, measured when this record was "
               "collected, not beside the regeneration)." + same_run_sentence(regen) + rebuild_sentence()
               + lazy_sentence())
    code = result.get("code_corpus")
    if code:
        out.append("- **Code data.** The code evaluation asks the target to complete a Python function from its "
                   "signature and docstring, which ShareGPT first turns rarely do. So the same target also answered "
                   f"{num(code['samples'], 'd')} of the {num(code['pool'], 'd')} public functions and methods of "
                   "Python's standard library that have a docstring of 60 characters or more, each cut after its "
                   "docstring and worded as the evaluation words its prompts (none is a HumanEval task): "
                   f"{num(code['answer_tokens'], 'd')} answer tokens, at {num(code['tokens_per_s'], '.0f')} tokens/s. "
                   "They train beside the ShareGPT sequences and are never held out, so held-out τ_prob is still "
                   "measured on the same ShareGPT sequences; the draft vocabulary stays the ShareGPT answers'.")
    words = result.get("math_corpus")
    if words:
        out.append("- **Math data.** No training split of GSM8K ships in a PyPI package, so the target also answered "
                   f"{num(words['samples'], 'd')} of {num(words['pool'], 'd')} grade-school word problems made from "
                   "templates (rates, fractions, percentages, change, ages, averages, …; "
                   "`dspark.train.word_problems.load_math_prompts`, none an evaluation question), worded as GSM8K "
                   f"words its questions: {num(words['answer_tokens'], 'd')} answer tokens, at "
                   f"{num(words['tokens_per_s'], '.0f')} tokens/s. They train as the code prompts do.")
    words = result.get("math2_corpus")
    if words:
        out.append(f"- **More math data.** A second series of {num(words['pool'], 'd')} word problems made from "
                   "shapes the first series does not use (profit, unit conversion, ratios, schedules, overtime, "
                   "fuel, quantities that grow day by day, …; `load_math_prompts(series=2)`), of which the target "
                   "answered "
                   f"{num(words['samples'], 'd')}: {num(words['answer_tokens'], 'd')} answer tokens, at "
                   f"{num(words['tokens_per_s'], '.0f')} tokens/s.")
    words = result.get("math3_corpus")
    if words:
        out.append(f"- **A third math series.** {num(words['pool'], 'd')} word problems from shapes neither earlier "
                   "series uses (areas, bus passengers, family tickets, commission, shared fares, paint, parking, "
                   "eggs by the carton, …; `load_math_prompts(series=3)`), of which the target answered "
                   f"{num(words['samples'], 'd')}: {num(words['answer_tokens'], 'd')} answer tokens, at "
                   f"{num(words['tokens_per_s'], '.0f')} tokens/s.")
    code = result.get("code2_corpus")
    if code:
        from dspark.train.pools import CODE2_DOCSTRING_CHARS, CODE_DOCSTRING_CHARS

        out.append(f"- **More code data.** A second series of {num(code['pool'], 'd')} standard-library functions: "
                   f"the documented ones the first leaves out, private functions with a docstring of "
                   f"{num(CODE_DOCSTRING_CHARS, 'd')} characters or more and any with a shorter one of at least "
                   f"{num(CODE2_DOCSTRING_CHARS, 'd')} (`load_code_prompts(series=2)`), of which the "
                   f"target answered {num(code['samples'], 'd')}: {num(code['answer_tokens'], 'd')} answer tokens, "
                   f"at {num(code['tokens_per_s'], '.0f')} tokens/s.")
    for name, arm in arms.items():
        vocab = arm.get("vocab") or {}
        runs = training_runs(arm.get("run"))
        covered = []
        if vocab:
            added = [pool for pool in POOLS if f"{pool}_coverage" in vocab]
            covered = [f"{num(100 * vocab['train_coverage'], '.2f')}% of the "
                       f"{'ShareGPT ' if added else ''}training answers"]
            covered += [f"{num(100 * vocab[f'{pool}_coverage'], '.2f')}% of the {POOL_ANSWERS[pool]}"
                        for pool in added]
            covered.append(f"{num(100 * vocab['held_out_coverage'], '.2f')}% of the held-out ones")
        coverage = (f"draft vocabulary of {num(vocab['draft_vocab_size'], 'd')} tokens covering "
                    f"{', '.join(covered[:-1])} and {covered[-1]}; ") if vocab else "full vocabulary; "
        arguments = (runs or [{}])[0].get("arguments", {})
        out.append(f"- **{label(name)}.** {draft_layers(arguments)}, "
                   f"{num(arm['steps'], 'd')} steps on {num(arm['train_sequences'], 'd')} sequences"
                   f"{', ' + pool_counts(arm) if pools_in(arm) else ''} "
                   f"({num(arm['train_answer_tokens'], 'd')} answer tokens; {coverage}"
                   f"held-out τ_prob {num(arm['final']['eval_tau_prob'])} on {num(arm['held_out_sequences'], 'd')} "
                   f"sequences). Wall-clock: {'; then '.join(wall_clock(r) for r in runs)}, building the corpus "
                   "not included." + recipe_difference(arguments, recipe) + continuation_sentence(arm.get("run")))
    out.append("")
    ranked = sorted(((arm["final"]["eval_tau_prob"], name) for name, arm in arms.items()
                     if "eval_tau_prob" in arm.get("final", {})), reverse=True)
    if len(ranked) > 1:
        out.append("At the last evaluation the arms rank " + " > ".join(
            f"{label(name)} ({num(tau)}, {num(arms[name]['steps'], 'd')} steps)" for tau, name in ranked)
                   + " in held-out τ_prob." + _at_dflash_steps(arms) + "\n")
    _figure_curve(arms, figures)
    out.append("![Held-out acceptance against training data](figures/tau_vs_tokens.png)\n")
    out.append("*Figure 2. Held-out τ_prob (the expected accepted length of T = 1 verification, bonus included) "
               "against the answer tokens each drafter had trained on, evaluated every "
               f"{num(recipe['eval_every'], 'd')} steps. The first point is the untrained drafter; past "
               f"{num(regen['answer_tokens'] / 1e3, '.0f')}k tokens the sequences repeat (a second pass over the "
               "corpus)." + _restarts_caption(arms) + " Each arm's data, steps, wall-clock and threads are listed "
               "above.*\n")
    _decoded_curve(out, figures)
    _ablations(out)
    _objectives(out)


FLAT_PER_DOUBLING = 0.05


def _decoded_curve(out: list[str], figures: Path) -> None:
    """Greedy decoded τ of the committed checkpoints against the answer tokens each had trained on
    (``acceptance_curve_cpu``): what Figure 2's held-out τ_prob became in decoding."""
    result = load("acceptance_curve_cpu")
    if result is None:
        return
    arms = decoded_points(result)
    dspark = arms.get("dspark") or []
    if len(dspark) < 3:
        return
    first, last = dspark[0], dspark[-1]

    def rates(points: list[dict]) -> str:
        return ", ".join(f"{d} {num(slope_per_doubling(points, lambda p, d=d: p['tau'][d]), '+.2f')}" for d in DOMAINS)

    text = (f"**Decoded, not only held out.** Every committed DSpark checkpoint, from {num(first['steps'], 'd')} to "
            f"{num(last['steps'], 'd')} steps, decoded the held-out prompts of §1 greedily with every slot verified "
            f"(`acceptance_curve_cpu`: {num(result['rows'][0]['prompts'], 'd')} prompts a domain, "
            f"{num(result['max_new_tokens'], 'd')} new tokens; Figure 2b). Mean τ rose from {num(first['mean'])} to "
            f"{num(last['mean'])}, about {num(slope_per_doubling(dspark), '.2f')} per doubling of the answer tokens "
            f"trained on (a least-squares fit over the {num(len(dspark), 'd')} checkpoints; {rates(dspark)}).")
    late = late_points(dspark)
    pools = pool_start_tokens(result["drafter_metadata"].get(last["name"], {}))
    if len(late) >= 3:
        text += (f" From {num(late[0]['steps'], 'd')} steps on ({num(len(late), 'd')} checkpoints) the rates were "
                 f"{rates(late)}")
        joined = [pool for pool, tokens in pools.items() if tokens >= late[0]["tokens"]]
        if joined:
            flat = abs(slope_per_doubling(late, lambda p: p["tau"]["chat"])) < FLAT_PER_DOUBLING
            text += (f", while {listing([POOLS[pool] for pool in joined])} joined the data (§2)"
                     + ("; chat, whose ShareGPT data stayed the same, stayed nearly flat" if flat else "")
                     + ". The curve is that of this drafter's path, not of more of the same data")
        text += "."
    dflash = arms.get("dflash") or []
    at_same = [(p, q) for p in dflash for q in dspark if q["steps"] == p["steps"]]
    if at_same:
        ahead = sum(q["mean"] > p["mean"] for p, q in at_same)
        text += (f" At the {listing([num(p['steps'], 'd') for p, _ in at_same])} steps where both arms have a "
                 f"checkpoint on the same data, DSpark's mean τ is above DFlash's at {num(ahead, 'd')} of "
                 f"{num(len(at_same), 'd')} (" + "; ".join(f"{num(q['mean'])} against {num(p['mean'])}"
                                                           for p, q in at_same) + ").")
    out.append(text + "\n")
    _figure_decoded_curve(arms, pools, figures)
    out.append("![Decoded acceptance against training data](figures/decoded_tau_vs_tokens.png)\n")
    out.append("*Figure 2b. Greedy decoded τ (γ = 7, every slot verified, bonus included) of each committed "
               "checkpoint against the answer tokens it had trained on, per domain (DSpark solid, DFlash dashed), "
               "on a log axis. Dotted lines: where a pool of code prompts (code, code2) or word problems (math, "
               "math2, math3) joined the DSpark drafter's data.*\n")


def pool_start_tokens(meta: dict) -> dict[str, float]:
    """The answer tokens a drafter had trained on when each added pool joined its data (from its metadata)."""
    seen = {c["step"]: c["answer_tokens_seen"] for c in meta.get("curve", [])}
    return {pool: seen[step] for pool, step in pool_start_steps(meta.get("run")).items() if step in seen}


def _figure_decoded_curve(arms: dict[str, list[dict]], pools: dict[str, float], figures: Path) -> None:
    from matplotlib.ticker import ScalarFormatter

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4))
    markers = {"math": "o", "code": "s", "chat": "^"}
    for arm, points in arms.items():
        for domain in DOMAINS:
            ax.plot([p["tokens"] / 1e6 for p in points], [p["tau"][domain] for p in points],
                    marker=markers[domain], linestyle="-" if arm == "dspark" else "--",
                    color=COLORS.get(arm), alpha=0.9 if arm == "dspark" else 0.6,
                    label=f"{label(arm)}, {domain}")
    for pool, tokens in pools.items():
        ax.axvline(tokens / 1e6, color="grey", linewidth=0.8, linestyle=":")
        ax.annotate(f"+{pool}", (tokens / 1e6, 1.0), xycoords=("data", "axes fraction"), rotation=90,
                    ha="right", va="top", fontsize=7, color="grey")
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.xaxis.set_minor_formatter(ScalarFormatter())
    ax.tick_params(axis="x", which="both", labelsize=8)
    ax.set_xlabel("answer tokens trained on (millions)")
    ax.set_ylabel("greedy decoded τ")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, ncol=2, loc="upper left", bbox_to_anchor=(0.0, 0.9))
    save(fig, figures, "decoded_tau_vs_tokens.png")


ABLATIONS = {
    "recipe": "the recipe",
    "recipe-seed1": "the recipe, another seed (initial weights and anchors)",
    "tap-rms": "each tap feature divided by its RMS before `fc`",
    "hidden-l1": "+ 1 × smooth-L1 from the draft's hidden state to the target's",
    "hidden-l1x5": "+ 5 × the same regression",
    "init-target": "draft layers start as the target's first two",
    "lr-3e-3": "learning rate 3e-3 instead of 1e-3",
}


def _ablations(out: list[str]) -> None:
    """Cheap training changes against the recipe and its seed noise (``training_ablations_cpu.json``)."""
    result = load("training_ablations_cpu")
    if result is None:
        return
    runs = {r["variant"]: r for r in result["runs"]}
    final = {name: r["curve"][-1] for name, r in runs.items()}
    base = final["recipe"]["eval_tau_prob"]
    noise = abs(final["recipe-seed1"]["eval_tau_prob"] - base) if "recipe-seed1" in final else None
    out.append(f"**Cheap changes to training, at equal steps** (`benchmarks/bench_ablations.py`, measured on "
               f"{machine(result)}). Each variant trains the recipe's drafter for {num(result['steps'], 'd')} steps "
               f"from the same initial weights on the same {num(result['train_sequences'], 'd')} sequences (the "
               f"{num(result['sequences'], 'd')} shortest of the corpus, {num(result['held_out'], 'd')} of them held "
               "out), in fp32, one thread each:\n")
    out.append("| variant | what changes | held-out τ_prob | slot-1 accuracy | τ_prob − recipe's |")
    out.append("|---|---|---|---|---|")
    for name, row in final.items():
        out.append(f"| {name} | {ABLATIONS.get(name, name)} | {num(row['eval_tau_prob'])} | "
                   f"{num(row['eval_accuracy'][0])} | {num(row['eval_tau_prob'] - base, '+.3f')} |")
    out.append("")
    if noise is not None:
        better = [name for name, row in final.items()
                  if not name.startswith("recipe") and row["eval_tau_prob"] - base > noise]
        if better:
            verdict = (", ".join(better) + (" beats" if len(better) == 1 else " beat") + " the recipe by more than "
                       "that, a lead to test at the recipe's full length before it changes the recipe.")
        else:
            verdict = ("none of the changes beats the recipe by more than that. At this scale the drafter is limited "
                       "by how much it has trained, not by how its inputs are scaled, how its layers start or what "
                       "its hidden state is regressed onto.")
        out.append(f"A second seed of the recipe moves τ_prob by {num(noise)}; {verdict}\n")


def _objectives(out: list[str]) -> None:
    """DSpark against DFlash at equal data and steps, two seeds each (``training_objectives_cpu.json``)."""
    result = load("training_objectives_cpu")
    if result is None:
        return
    final = {r["variant"]: r["curve"][-1] for r in result["runs"]}
    arms = {"DSpark": [final[n] for n in ("recipe", "recipe-seed1") if n in final],
            "DFlash": [final[n] for n in ("dflash", "dflash-seed1") if n in final]}
    if not all(arms.values()):
        return
    out.append(f"**DSpark against DFlash at equal data and steps** (`benchmarks/bench_ablations.py --study "
               f"objectives`, measured on {machine(result)}). Both train the recipe's two-layer drafter with its "
               f"reduced draft vocabulary for {num(result['steps'], 'd')} steps on the same "
               f"{num(result['train_sequences'], 'd')} sequences (features from the {result['features']} target), "
               "in fp32, one thread each; DFlash has no Markov or confidence head and trains on cross-entropy "
               "alone. Seeds 0 and 1 set the initial weights and the anchors:\n")
    out.append("| objective | held-out τ_prob, seed 0 / seed 1 | slot-1 accuracy, seed 0 / seed 1 |")
    out.append("|---|---|---|")
    for name, rows in arms.items():
        out.append(f"| {name} | {' / '.join(num(r['eval_tau_prob']) for r in rows)} | "
                   f"{' / '.join(num(r['eval_accuracy'][0]) for r in rows)} |")
    out.append("")
    taus = {name: [r["eval_tau_prob"] for r in rows] for name, rows in arms.items()}
    gap = sum(taus["DSpark"]) / len(taus["DSpark"]) - sum(taus["DFlash"]) / len(taus["DFlash"])
    spread = max(max(t) - min(t) for t in taus.values())
    verdict = ("DSpark's worse seed still beats DFlash's better one" if min(taus["DSpark"]) > max(taus["DFlash"])
               else "the seeds overlap, so these runs cannot order the two")
    out.append(f"Mean τ_prob, DSpark minus DFlash: {num(gap, '+.3f')}, against a spread between seeds of at most "
               f"{num(spread)}; {verdict}.\n")


def rebuild_sentence() -> str:
    """What keeping the answers instead of the features costs and saves (``corpus_rebuild_cpu.json``), or ""."""
    result = load("corpus_rebuild_cpu")
    if result is None:
        return ""
    runs = result["runs"]
    tokens = sum(r["answer_tokens"] for r in runs)
    per_token = sum(r["archive_bytes"] for r in runs) / tokens
    return (f" The answers are committed without their features ({num(per_token, '.2f')} bytes per answer token, "
            "`benchmarks/recipes/smollm2_drafter.answers.npz`), and the recipe rebuilds the features from them "
            "with one forward per batch of whole sequences: "
            f"{num(tokens / sum(r['rebuild_seconds'] for r in runs), '.0f')} answer tokens/s against "
            f"{num(tokens / sum(r['answer_seconds'] for r in runs), '.0f')} for answering the same "
            f"{num(result['prompts'], 'd')} prompts in the same run ({num(result['speedup'], '.1f')}×, "
            "`benchmarks/bench_corpus.py`); the rebuilt features differ from the captured ones by "
            f"{num(100 * result['feature_error']['mean_abs_over_rms'], '.2f')}% of their RMS on average "
            "(bf16 rounding).")


def lazy_sentence() -> str:
    """What computing features as training reads them costs against rebuilding them all first
    (``corpus_lazy_cpu.json``), or ""."""
    result = load("corpus_lazy_cpu")
    if result is None:
        return ""
    runs, tokens = result["runs"], result["sequence_tokens"] * len(result["runs"])
    rebuild = tokens / sum(r["rebuild_seconds"] for r in runs)
    lazy = tokens / sum(r["lazy_seconds"] for r in runs)
    return (" A run with `features=\"lazy\"` skips that rebuild: training computes a sequence's features when it "
            f"first reads it, in one padded forward per step's {num(result['group'], 'd')} sequences, at "
            f"{num(lazy, '.0f')} sequence tokens/s against the up-front rebuild's {num(rebuild, '.0f')} on the same "
            f"{num(result['prompts'], 'd')} sequences in one run, so it "
            + (f"costs less whenever a run reads fewer than {num(100 * lazy / rebuild, '.0f')}% of its corpus"
               if lazy < rebuild else "costs no more than the rebuild even for a run that reads its whole corpus")
            + " (a continuation of a few thousand steps on the grown archives reads far less).")


def _at_dflash_steps(arms: dict) -> str:
    """DSpark's held-out τ_prob at DFlash's last step, when DSpark trained longer, or ""."""
    if "dspark" not in arms or "dflash" not in arms or arms["dspark"]["steps"] <= arms["dflash"]["steps"]:
        return ""
    point = next((c for c in arms["dspark"].get("curve", []) if c["step"] == arms["dflash"]["steps"]), None)
    if point is None:
        return ""
    return (f" At DFlash's {num(point['step'], 'd')} steps DSpark had {num(point['eval_tau_prob'])} against "
            f"DFlash's {num(arms['dflash']['final']['eval_tau_prob'])}.")


def same_run_sentence(regen: dict) -> str:
    """Regeneration against batch-1 generation timed in one run (``bench_recipe``), if it was."""
    here = regen.get("same_run")
    if not here:
        return ""
    return (f" Timed in that same run, the target answered {num(here['prompts'], 'd')} pool prompts in batches of "
            f"{num(here['batch_size'], 'd')} at {num(here['tokens_per_s'], '.0f')} answer tokens/s, features "
            f"captured and written: {num(here['speedup_over_batch1'], '.1f')}× its batch-1 generation (with so few "
            "prompts a batch mixes more lengths than the whole pool's did, so more of it is padding).")


def _restarts_caption(arms: dict) -> str:
    """The figure caption's sentence on arms whose training was continued with a restarted schedule, or ""."""
    restarted = {}
    for name, arm in arms.items():
        runs = training_runs(arm.get("run"))
        # Each continuation restarts the schedule at the steps every run before it took.
        points = tuple(sum(r["arguments"]["steps"] for r in runs[:i]) for i in range(1, len(runs)))
        if points:
            restarted.setdefault(points, []).append(label(name))

    def labels(names: list[str]) -> str:  # a label with a comma in it is set apart in italics
        return listing([f"*{n}*" if "," in n else n for n in names])

    return "".join(f" {labels(names)} {'was' if len(names) == 1 else 'were'} continued past "
                   f"{'step' if len(points) == 1 else 'steps'} {listing([num(p, 'd') for p in points])} with the "
                   "learning-rate schedule restarted." for points, names in restarted.items())


def _figure_curve(arms: dict, figures: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for name, arm in arms.items():
        curve = arm.get("curve") or []
        ax.plot([c["answer_tokens_seen"] / 1e3 for c in curve], [c["eval_tau_prob"] for c in curve], marker="o",
                color=COLORS.get(name), label=label(name))
    ax.set_xlabel("answer tokens trained on (thousands)")
    ax.set_ylabel("held-out τ_prob")
    ax.set_ylim(bottom=1.0)
    ax.grid(alpha=0.3)
    ax.legend()
    save(fig, figures, "tau_vs_tokens.png")
