"""Shared by every section: where results live, how numbers are printed (and recorded), how drafters and
runs are named, and the recipe's record of its runs."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
PAPER = Path(__file__).resolve().parent
DOMAINS = ("math", "code", "chat")
LABELS = {"dspark": "DSpark", "dflash": "DFlash", "eagle3": "EAGLE-3-style", "dspark-ce": "DSpark, CE only"}


COLORS = {"dspark": "tab:red", "dflash": "tab:blue", "eagle3": "tab:green", "dspark-ce": "tab:purple"}
# An earlier checkpoint of an arm, kept to compare arms at equal training budget: ``dspark-steps8000``.
EARLIER = re.compile(r"(.+)-steps(\d+)")


def label(name: str) -> str:
    """How the paper names a drafter: ``dspark-steps8000`` reads "DSpark at 8000 steps"."""
    earlier = EARLIER.fullmatch(name)
    if earlier:
        return f"{LABELS.get(earlier[1], earlier[1])} at {num(int(earlier[2]), 'd')} steps"
    return LABELS.get(name, name)


printed: set[str] = set()  # every number the text shows, as shown
quoted: set[str] = set()  # the subset that are the paper's own numbers


def num(value: float, spec: str = ".3f") -> str:
    """Format a value read from a results file, and record it."""
    text = format(value, spec)
    printed.add(text.lstrip("+-"))
    return text


def quote(value: float, spec: str = "g") -> str:
    """Format one of the DSpark paper's numbers, and record it as quoted."""
    text = format(value, spec)
    printed.add(text.lstrip("+-"))
    quoted.add(text.lstrip("+-"))
    return text


loaded: list[str] = []  # the results files the section being built has read, in order


def load(name: str, cited: bool = True) -> dict | None:
    """A results file, or None; ``cited`` files are listed in the provenance line of the section that read them."""
    path = RESULTS / f"{name}.json"
    if not path.exists():
        return None
    if cited and name not in loaded:
        loaded.append(name)
    return json.loads(path.read_text(encoding="utf-8"))


def git(*args: str) -> str | None:
    import subprocess

    try:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
    except OSError:
        return None
    return done.stdout if done.returncode == 0 else None


def results(out: list[str], name: str, heading: str, script: str) -> dict | None:
    """Open a section: its heading, then the results file, or a line saying which script would make it."""
    out.append(f"{heading}\n")
    result = load(name)
    if result is None:
        out.append(f"*Not measured yet: run `python {script}`.*\n")
    return result


def recipe_difference(arguments: dict, recipe: dict) -> str:
    """A sentence naming the settings in which a drafter's training ``arguments`` differ from ``recipe``, or ""
    when none do. Objective, layers and steps are printed beside it (EAGLE-3 has one layer by construction),
    and how often it was evaluated changes nothing it learned. The recipe's ``auto`` precision is whichever
    dtype trains faster on the machine, so a run that named its dtype differs only in the dtype that ran,
    which is printed beside it too."""
    skipped = {"objective", "num_draft_layers", "steps", "eval_every"} | \
        ({"precision"} if recipe.get("precision") == "auto" else set())
    earlier = {k: v for k, v in arguments.items() if k in recipe and v != recipe[k] and k not in skipped}
    if not earlier:
        return ""
    listed = ", ".join(f"{k} {num(v, 'd') if isinstance(v, int) and not isinstance(v, bool) else v}"
                       for k, v in sorted(earlier.items()))
    return f" Trained by an earlier recipe ({listed}), not re-trained since."


def training_runs(run: dict | None) -> list[dict]:
    """A drafter's training runs, first to last: the run that trained it from scratch, then each run that
    continued it (``continue_from``), as their metadata records them."""
    runs = []
    while run:
        runs.insert(0, run)
        run = (run.get("parent") or {}).get("run")
    return runs


# The prompt pools a recipe run may add to the ShareGPT sequences, as the paper names them, and as it names their
# answers when it reports the draft vocabulary's coverage.
POOLS = {"code": "standard-library code prompts", "math": "word problems", "math2": "second-series word problems",
         "math3": "third-series word problems", "code2": "second-series code prompts",
         "sampled": "sampled answers to the ShareGPT training prompts",
         "followup": "later ShareGPT turns as prompts of their own"}


def pool_count(arguments: dict, pool: str) -> int:
    """How many of ``pool``'s prompts a run's recorded ``arguments`` trained on: ``pools`` holds them, and runs from
    before pools were data (the committed drafters') recorded ``<pool>_prompts``."""
    counts = {recorded["name"]: recorded.get("count", 0) for recorded in arguments.get("pools", [])}
    return counts.get(pool) or arguments.get(f"{pool}_prompts") or 0


def listing(items: list[str]) -> str:
    """``"a"``, ``"a and b"``, ``"a, b and c"``."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def pool_start_steps(run: dict | None) -> dict[str, int]:
    """The step from which a drafter's training data held each added prompt pool, for the pools it used."""
    starts, done = {}, 0
    for r in training_runs(run):
        for pool in POOLS:
            if pool_count(r["arguments"], pool) and pool not in starts:
                starts[pool] = done
        done += r["arguments"]["steps"]
    return starts


def pools_in(meta: dict) -> list[str]:
    """The added pools a drafter's metadata counts sequences of."""
    return [pool for pool in POOLS if meta.get(f"{pool}_sequences")]


def pool_counts(meta: dict) -> str:
    """``"1600 of them code prompts, 1600 word problems"``, or "" when a drafter trained on ShareGPT alone."""
    return ", ".join(f"{num(meta[f'{pool}_sequences'], 'd')} {'of them ' if i == 0 else ''}"
                     f"{POOLS[pool].removeprefix('standard-library ')}" for i, pool in enumerate(pools_in(meta)))


def continuation_sentence(run: dict | None) -> str:
    """A sentence on the runs that continued a drafter past its first training, or ""."""
    runs = training_runs(run)
    if len(runs) < 2:
        return ""
    later = runs[1:]
    times = {1: "once", 2: "twice", 3: "three times", 4: "four times", 5: "five times", 6: "six times"}.get(
        len(later), f"{len(later)} times")
    steps = [num(r["arguments"]["steps"], "d") for r in later]
    rates = {r["arguments"]["lr"] for r in later}
    if len(rates) == 1:
        rate = f"at a peak learning rate of {num(rates.pop(), 'g')}"
        if len(set(steps)) == 1:
            how = f"{times}, {'each time ' if len(later) > 1 else ''}for {steps[0]} more steps {rate}"
        else:
            how = f"{times}, for {', '.join(steps[:-1])} and {steps[-1]} more steps, each {rate},"
    else:  # consecutive runs at one rate are told together: "for 2000 and 4000 more steps at …, then for …"
        groups: list[tuple[float, list[str]]] = []
        for n, r in zip(steps, later):
            if groups and groups[-1][0] == r["arguments"]["lr"]:
                groups[-1][1].append(n)
            else:
                groups.append((r["arguments"]["lr"], [n]))
        how = f"{times}, " + ", then ".join(
            f"for {', '.join(ns[:-1]) + ' and ' if len(ns) > 1 else ''}{ns[-1]} more steps at a peak learning rate "
            f"of {num(lr, 'g')}" for lr, ns in groups) + ","
    added = []
    for pool, name in POOLS.items():
        runs_with = [r for r in later if pool_count(r["arguments"], pool)]
        if runs_with:
            added.append(("the last run" if len(runs_with) == 1 else f"the last {len(runs_with)} runs")
                         + f" with {num(pool_count(runs_with[-1]['arguments'], pool), 'd')} {name} added")
    data = " over the same ShareGPT sequences, " + listing(added) + " (§2)" if added else \
        " over the same sequences"
    return (f" Its first {num(runs[0]['arguments']['steps'], 'd')} steps were the recipe's; it was then continued "
            + how + data + " (the learning-rate schedule restarted: warm-up, then "
            "cosine to 0; the data order and anchors picked up where training had stopped; AdamW's moments "
            "started empty).")


def eagle3_budget_sentence(arms: dict) -> str:
    """How the EAGLE-3-style arm's training budget compares with DSpark's (``arms``: drafter metadata by name),
    followed by a space; empty without both arms. Answer tokens are compared too: arms trained on separately
    regenerated corpora of the same prompts can differ by a few tokens where bf16 rounding flips a greedy choice."""
    if "eagle3" not in arms or "dspark" not in arms:
        return ""
    eagle3, dspark = arms["eagle3"], arms["dspark"]
    if eagle3.get("steps") != dspark.get("steps") or eagle3.get("train_sequences") != dspark.get("train_sequences"):
        budget = (f"it was trained for {num(eagle3.get('steps'), 'd')} steps on "
                  f"{num(eagle3.get('train_sequences'), 'd')} sequences, DSpark for {num(dspark.get('steps'), 'd')} "
                  f"on {num(dspark.get('train_sequences'), 'd')}")
    else:
        budget = "it was trained for the same number of steps on the same number of sequences"
        tokens = eagle3.get("train_answer_tokens"), dspark.get("train_answer_tokens")
        if tokens[0] != tokens[1] and None not in tokens:
            budget += f" ({num(tokens[0], 'd')} answer tokens; DSpark's held {num(tokens[1], 'd')})"
    return ("The EAGLE-3-style drafter drafts the full vocabulary and unrolls γ steps, so its training steps "
            f"cost more; {budget}. ")


def draft_layers(arguments: dict) -> str:
    """"N draft layer(s)" from a drafter's recorded training arguments."""
    layers = arguments.get("num_draft_layers")
    return f"{num(layers, 'd')} draft layer{'s' if layers != 1 else ''}"


def machine(result: dict) -> str:
    env = result["environment"]
    cpu = env.get("cpu_model") or env["processor"]
    where = env["device"] if env["device"] != "cpu" else f"CPU ({cpu}, {num(env['cpu_count'], 'd')} cores)"
    printed.add(env["commit"].split("-")[0])  # a commit of digits only would read as a number
    return f"{where}, torch {env['torch']}, Triton {env.get('triton')}, commit {env['commit']}"


def drafter_date() -> str | None:
    """When training wrote the shipped DSpark drafter (``training_recipe.json``), if that was recorded."""
    recipe = load("training_recipe", cited=False)
    return recipe["arms"]["dspark"].get("written_at") if recipe and "dspark" in recipe["arms"] else None


def acceptance_steps(result: dict) -> str:
    """The training steps of the DSpark drafter that ``acceptance_cpu`` decoded with, as text."""
    steps = result.get("drafter_metadata", {}).get("dspark", {}).get("steps")
    return "unrecorded" if steps is None else num(steps, "d")


def predates_shipped_drafter(result: dict) -> bool:
    """Whether ``result`` was measured before the shipped DSpark drafter was written (ISO dates compare as text)."""
    shipped = drafter_date()
    return shipped is not None and result["environment"]["date"] < shipped


def stale_note(result: dict, what: str) -> str:
    """A line saying that ``result`` predates the current drafter, when it does."""
    if not predates_shipped_drafter(result):
        return ""
    return (f"*Stale: these results (commit {result['environment']['commit']}) were measured with {what}, "
            "before the shipped drafter was trained, and were not re-run for it.*\n")


def decoded_points(result: dict) -> dict[str, list[dict]]:
    """Each arm's checkpoints in a greedy acceptance result, ordered by the answer tokens they had trained on:
    ``{arm: [{"name", "steps", "tokens", "tau": {domain: τ}, "mean"}]}`` (``dspark-steps8000`` is arm ``dspark``)."""
    meta = result.get("drafter_metadata", {})
    arms: dict[str, list[dict]] = {}
    for name in dict.fromkeys(r["drafter"] for r in result["rows"]):
        curve = (meta.get(name) or {}).get("curve")
        if not curve:
            continue
        tau = {r["domain"]: r["tau"] for r in result["rows"] if r["drafter"] == name and r["temperature"] == 0}
        if set(tau) != set(DOMAINS):
            continue
        earlier = EARLIER.fullmatch(name)
        arms.setdefault(earlier[1] if earlier else name, []).append(
            {"name": name, "steps": meta[name]["steps"], "tokens": curve[-1]["answer_tokens_seen"], "tau": tau,
             "mean": sum(tau.values()) / len(tau)})
    return {arm: sorted(points, key=lambda p: p["tokens"]) for arm, points in arms.items()}


def late_points(points: list[dict]) -> list[dict]:
    """The checkpoints that had trained on at least a quarter of the last one's answer tokens."""
    return [p for p in points if p["tokens"] >= points[-1]["tokens"] / 4]
