"""Which commit measured each results file, and which later commits changed the code behind it."""

from __future__ import annotations

import json

from paper.common import PAPER, RESULTS, git, load, num, printed

PROVENANCE = PAPER / "provenance.json"
LIBRARY = ["dspark", "kernels", "reference"]
TRAINING = ["dspark/training.py", "dspark/corpus.py", "dspark/loss.py", "dspark/drafter.py", "dspark/backbone.py",
            "dspark/attention.py", "dspark/markov.py", "dspark/confidence.py", "dspark/vocab.py", "dspark/data.py",
            "dspark/target.py", "benchmarks/recipes",
            # Where those modules live since the package was split into runtime, files and train.
            "dspark/train", "dspark/runtime"]
# The code behind each results file: a change to any of these paths after its commit is named beside it.
SOURCES = {
    "acceptance_cpu": LIBRARY + ["benchmarks/bench_acceptance.py"],
    "acceptance_candidates_cpu": LIBRARY + ["benchmarks/bench_acceptance.py"],
    "acceptance_curve_cpu": LIBRARY + ["benchmarks/bench_acceptance.py"],
    "agreement_cpu": LIBRARY + ["benchmarks/bench_agreement.py"],
    "training_recipe": TRAINING + ["benchmarks/bench_recipe.py"],
    "training_ablations_cpu": TRAINING + ["benchmarks/bench_ablations.py"],
    "training_objectives_cpu": TRAINING + ["benchmarks/bench_ablations.py"],
    "corpus_rebuild_cpu": ["dspark/corpus.py", "dspark/target.py", "dspark/data.py", "benchmarks/bench_corpus.py",
                           "dspark/train/corpus.py", "dspark/runtime/target.py", "dspark/runtime/prompts.py",
                           "dspark/train/pools.py", "dspark/train/answers.py"],
    "corpus_lazy_cpu": ["dspark/corpus.py", "dspark/training.py", "dspark/target.py", "benchmarks/bench_corpus.py",
                        "dspark/train/corpus.py", "dspark/train/trainer.py", "dspark/train/features.py",
                        "dspark/runtime/target.py", "dspark/train/answers.py"],
    "sweeps": TRAINING + ["benchmarks/bench_sweeps.py"],
    "calibration_cpu": LIBRARY + ["benchmarks/bench_calibration.py"],
    "scheduler": ["dspark/scheduler.py", "reference/scheduler.py", "kernels/scheduler.py",
                  "benchmarks/bench_scheduler.py"],
    "scheduler_measured_cpu": LIBRARY + ["benchmarks/bench_scheduler.py"],
    "appendix_a": ["dspark/scheduler.py", "benchmarks/bench_appendix_a.py"],
    "sps_cpu": ["dspark/target.py", "dspark/linear.py", "dspark/scheduler.py", "benchmarks/bench_sps.py",
                "dspark/runtime/target.py"],
    "sps_cpu_xeon": ["dspark/target.py", "dspark/linear.py", "dspark/invariant.py", "dspark/scheduler.py",
                     "benchmarks/bench_sps.py", "dspark/runtime/target.py", "dspark/runtime/invariant.py"],
    "sps_cuda": ["dspark/target.py", "dspark/scheduler.py", "benchmarks/bench_sps.py", "dspark/runtime/target.py"],
    "generalization_cpu": TRAINING + ["benchmarks/bench_generalization.py"],
    "e2e_cpu": LIBRARY + ["benchmarks/bench_e2e.py"],
    "kernels_cpu": LIBRARY + ["benchmarks/bench_kernels.py"],
    "kernels_gpu": LIBRARY + ["benchmarks/bench_kernels.py"],
    "training_cpu_default": LIBRARY + ["benchmarks/bench_training.py"],
    "training_cpu_recipe": LIBRARY + ["benchmarks/bench_training.py"],
    "training_cuda_paper": LIBRARY + ["benchmarks/bench_training.py"],
    "training_cuda_recipe": LIBRARY + ["benchmarks/bench_training.py"],
    "round_cuda": LIBRARY + ["benchmarks/bench_round.py"],
    "concurrency_cpu": LIBRARY + ["benchmarks/bench_concurrency.py"],
    "long_context_cpu": LIBRARY + ["benchmarks/bench_long_context.py"],
    "streaming_cpu": ["dspark/train", "benchmarks/bench_streaming.py"],
    "compile_matrix_triton3.9": ["kernels", "benchmarks/compile_matrix.py"],
    "compile_matrix_triton3.6": ["kernels", "benchmarks/compile_matrix.py"],
}


def compute_provenance(head: str | None = None) -> dict:
    """For every results file: its commit, and the commits and files under its ``SOURCES`` that changed from
    there to ``head`` (default: HEAD, ``-dirty`` when those paths hold uncommitted changes)."""
    if head is None:
        head = (git("rev-parse", "--short", "HEAD") or "").strip()
        if not head:
            raise RuntimeError("paper provenance needs a git checkout (git rev-parse HEAD failed)")
        watched = sorted({p for paths in SOURCES.values() for p in paths})
        if (git("status", "--porcelain", "--", *watched) or "").strip():
            head += "-dirty"
    base = head.split("-")[0]
    results = {}
    for name, paths in SOURCES.items():
        path = RESULTS / f"{name}.json"
        if not path.exists():
            continue
        commit = json.loads(path.read_text(encoding="utf-8"))["environment"]["commit"]
        since = commit.split("-")[0]
        # Test helpers live in the package but measure nothing.
        spec = [*paths, ":(exclude)dspark/testing.py"]
        count = git("rev-list", "--count", f"{since}..{base}", "--", *spec)
        changed = git("diff", "--name-only", since, base, "--", *spec)
        results[name] = {"commit": commit, "commits_since": None if count is None else int(count),
                         "changed": None if changed is None else changed.split()}
    return {"built_at": head, "results": results}


def provenance_line(names: list[str], provenance: dict) -> str:
    """One line naming, for each results file a section used, its commit and what changed since it."""
    parts = []
    for name in names:
        if name not in SOURCES:
            continue
        entry = provenance["results"].get(name)
        commit = load(name, cited=False)["environment"]["commit"]
        if entry is None or entry["commit"] != commit:
            raise RuntimeError(f"paper/provenance.json does not describe {name}.json at commit {commit}: "
                               "run python -m paper.build")
        printed.add(commit.split("-")[0])  # a commit of digits only would read as a number
        if entry["commits_since"] is None:
            parts.append(f"`{name}` at {commit} (not in this history)")
        elif not entry["changed"]:
            parts.append(f"`{name}` at {commit} (its code unchanged since)")
        else:
            shown = ", ".join(f"`{f}`" for f in entry["changed"][:4])
            more = len(entry["changed"]) - 4
            shown += f" and {num(more, 'd')} more" if more > 0 else ""
            parts.append(f"`{name}` at {commit} ({num(entry['commits_since'], 'd')} later "
                         f"commit{'s' if entry['commits_since'] != 1 else ''} changed {shown})")
    if not parts:
        return ""
    built = provenance["built_at"]
    printed.add(built.split("-")[0])
    return f"*Provenance (paper built at {built}): " + "; ".join(parts) + ".*\n"


def group_by_commit(items) -> dict[str, list[str]]:
    """``(what, provenance)`` pairs grouped under "commit C (YYYY-MM-DD)", in the order they come, recording the
    commit and the date as printed."""
    groups: dict[str, list[str]] = {}
    for what, provenance in items:
        day = provenance["date"][:10]
        groups.setdefault(f"commit {provenance['commit']} ({day})", []).append(what)
        printed.add(provenance["commit"].split("-")[0])  # a commit of digits only, and the date, read as numbers
        printed.update(day.split("-"))
    return groups
