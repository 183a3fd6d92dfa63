"""How much better a trained drafter predicts the sequences it trained on than held-out ones.

Training's held-out evaluation (τ_prob, CE and L1 at fixed anchors, as :meth:`dspark.train.trainer.Trainer.evaluate`)
is run on the recipe's ShareGPT corpus and pools: the held-out sequences (the highest prompt indices, which
training evaluates on), ``--samples`` training sequences spread evenly over the rest, and the first ``--samples``
of each extra prompt pool the drafter trained on (all of which train). A large gap between the first two means
the drafter memorises its data, which more data or regularisation (the recipe's ``dropout``) addresses; no gap
would mean it is too small to fit even what it saw. A mean of drafters' weights (``python -m dspark average``) is
measured like any drafter, on every pool one of its ingredients trained on.

The samples are read from the recipe's cache where it holds them, else from the run's committed answers archives
(``benchmarks/recipes/``); features the cache lacks (a fresh machine, or a run with ``features="lazy"``, which
stores only those it read) are computed by the target in the run's precision and stored there, as training would.
Writes ``generalization_cpu.json``. ``--keep FILE`` keeps the rows of an earlier result for the drafters this run
does not measure (one no longer on disk stays in the table), in their order and before the new ones, each with
the commit and date it was measured at (``measured``).

    python benchmarks/bench_generalization.py [DRAFTER_DIR ...] [--samples 48] [--keep FILE] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.environment import write_result  # noqa: E402
from dspark.files.checkpoint import load_drafter, read_checkpoint_config, shipped_drafter_dir  # noqa: E402
from dspark.runtime.target import load_default_target  # noqa: E402
from dspark.train.answers import load_answers  # noqa: E402
from dspark.train.config import TrainConfig  # noqa: E402
from dspark.train.corpus import corpus_order, load_corpus, sample_path  # noqa: E402
from dspark.train.features import OfflineFeatures  # noqa: E402
from dspark.train.pipeline import recipe_sharegpt_split  # noqa: E402
from dspark.train.pools import PoolSpec, load_training_prompts  # noqa: E402
from dspark.train.trainer import Trainer  # noqa: E402

# Drafters trained before a recipe's pools were data (the shipped one among them) record each pool as
# ``<name>_prompts`` and ``<name>_answers`` (and ``sampled_temperature``), its source fixed by its name.
EARLIER_POOLS = {"code": {"source": "stdlib-code"}, "math": {"source": "word-problems"},
                 "math2": {"source": "word-problems", "series": 2}, "math3": {"source": "word-problems", "series": 3},
                 "code2": {"source": "stdlib-code", "series": 2}, "sampled": {"source": "sharegpt-resampled"},
                 "followup": {"source": "sharegpt-followups"}}


def spread(items: list, count: int) -> list:
    """``count`` of ``items`` spread evenly over them, the first and the last included (all when fewer)."""
    if count >= len(items):
        return list(items)
    if count == 1:
        return [items[0]]
    return [items[round(i * (len(items) - 1) / (count - 1))] for i in range(count)]


def last_run_curve(meta: dict) -> list[dict]:
    """The held-out τ_prob that training recorded over the drafter's last run (from its parent's last step when it
    continued one)."""
    parent = meta.get("run", {}).get("parent")
    start = parent["steps"] if parent else 0
    return [{"step": c["step"], "tau_prob": c["eval_tau_prob"]} for c in meta.get("curve", []) if c["step"] >= start]


RECIPES = Path(__file__).resolve().parent / "recipes"


def archive(name: str | None) -> Path | None:
    """The committed answers archive of that file name (as training arguments record it), if any."""
    return RECIPES / name if name else None


def training_pools(arguments: dict) -> list[PoolSpec]:
    """The extra pools a drafter trained on, from its training ``arguments``, their archives committed ones."""
    if "pools" in arguments:
        return [PoolSpec(**{**pool, "answers": archive(pool.get("answers"))}) for pool in arguments["pools"]]
    return [PoolSpec(name, count=arguments[f"{name}_prompts"], answers=archive(arguments.get(f"{name}_answers")),
                     temperature=arguments["sampled_temperature"] if name == "sampled" else 0.0, **source)
            for name, source in EARLIER_POOLS.items() if arguments.get(f"{name}_prompts")]


def pool_samples(directory: Path, keys: list[int], answers: Path | None) -> list:
    """The samples of prompt ``keys`` from the corpus at ``directory``, or from the archive ``answers`` when the
    corpus lacks some."""
    if answers is None or all(sample_path(directory, key).exists() for key in keys):
        return load_corpus(directory, keys)
    return load_answers(answers).samples(keys)


def evaluate(target, features_target, drafter, directory: Path, samples, arguments: dict, precision: str) -> dict:
    """Training's evaluation of ``drafter`` on ``samples`` of the corpus at ``directory``, with the anchors per
    sequence of its training ``arguments``; ``features_target`` computes the features the corpus lacks."""
    source = OfflineFeatures(directory, target.tap_layers, target.hidden_size, target=features_target)
    config = TrainConfig(num_anchors=arguments["num_anchors"], precision=precision, objective="dspark")
    result = Trainer(drafter, target.lm_head_weight(), source, samples, config, held_out=samples).evaluate()
    return {"sequences": len(samples), "tau_prob": result["eval_tau_prob"], "ce": result["eval_ce"],
            "l1": result["eval_l1"], "slot1_accuracy": result["eval_accuracy"][0]}


def measure(target, directory: Path, count: int, features_targets: dict) -> dict:
    """The groups' scores for the drafter at ``directory``; ``features_targets`` caches the target of each
    precision that computes missing features."""
    meta = read_checkpoint_config(directory).get("metadata", {})
    run = meta.get("run", {})
    arguments = run.get("arguments")
    if not arguments or arguments.get("objective") != "dspark":
        raise SystemExit(f"{directory}: not a DSpark drafter the recipe trained (no training record)")
    precision = run["train_config"]["precision"]
    try:
        corpus, train, held_out = recipe_sharegpt_split(arguments, precision, answers=archive(arguments.get("answers")))
    except ValueError as error:
        raise SystemExit(str(error)) from None
    if precision not in features_targets:
        features_targets[precision] = load_default_target(
            dtype=torch.bfloat16 if precision == "bf16" else torch.float32)
    features = features_targets[precision]
    prompts = load_training_prompts(arguments["num_prompts"])
    drafter = load_drafter(directory, target)
    pools = training_pools(arguments)
    resampled = [pool for pool in pools if pool.source == "sharegpt-resampled"]
    row = {"drafter": directory.name, "steps": meta.get("steps"), "lr": arguments.get("lr"),
           "layers": drafter.config.num_draft_layers, "dropout": arguments.get("dropout", 0.0),
           "sampled_prompts": sum(pool.count for pool in resampled),
           "sampled_temperature": resampled[0].temperature if resampled else None,
           "followup_prompts": sum(pool.count for pool in pools if pool.source == "sharegpt-followups"),
           "ce_weight": arguments.get("ce_weight"), "l1_weight": arguments.get("l1_weight"),
           "average_of": [a["directory"] for a in meta.get("average_of", [])],
           "held_out": evaluate(target, features, drafter, corpus, held_out, arguments, precision),
           "train": evaluate(target, features, drafter, corpus, spread(train, count), arguments, precision),
           "recorded_held_out_tau_prob": meta.get("final", {}).get("eval_tau_prob"),
           "last_run_curve": last_run_curve(meta)}
    for pool in pools:
        directory, answers = pool.corpus_dir(corpus), pool.answers
        # The pool's corpus answered the first `count` prompts of its own shuffled order.
        manifest = directory / "corpus.json"
        recorded = json.loads(manifest.read_text(encoding="utf-8")) if manifest.exists() or answers is None \
            else load_answers(answers).manifest
        keys = corpus_order(recorded["settings"]["num_prompts"])[: pool.count]
        dropped = pool.held_out({prompts[s.key] for s in held_out})  # training left these out
        keys = [key for key in keys if key not in dropped]
        row[f"{pool.name}_train"] = evaluate(target, features, drafter, directory,
                                             pool_samples(directory, keys[:count], answers), arguments, precision)
    return row


def kept_rows(earlier: dict, measured: list[dict], samples: int) -> list[dict]:
    """``earlier``'s rows (a generalization result) with those of the drafters in ``measured`` replaced by the new
    measurements, the others stamped with the commit and date they were measured at (``measured``: kept from an
    earlier keep), then the new drafters' rows. Refuses a result of another ``samples``, whose groups differ."""
    if earlier.get("samples") != samples:
        raise SystemExit(f"cannot keep rows measured on {earlier.get('samples')} sequences a group beside rows of "
                         f"{samples}")
    environment = earlier.get("environment", {})
    stamp = {"commit": environment.get("commit"), "date": environment.get("date")}
    fresh = {row["drafter"]: row for row in measured}
    rows = [fresh.pop(row["drafter"]) if row["drafter"] in fresh else {**row, "measured": row.get("measured", stamp)}
            for row in earlier["rows"]]
    return rows + list(fresh.values())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("drafters", nargs="*", type=Path, help="drafter directories (default: the shipped one)")
    parser.add_argument("--samples", type=int, default=48, help="training sequences per group")
    parser.add_argument("--keep", type=Path, default=None,
                        help="an earlier generalization_cpu.json whose rows of drafters not measured now are kept")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.samples < 1:
        raise SystemExit("--samples must be positive")
    directories = args.drafters or [shipped_drafter_dir()]
    earlier = json.loads(args.keep.read_text(encoding="utf-8")) if args.keep else None
    if earlier is not None:
        kept_rows(earlier, [], args.samples)  # refuse a file of another --samples before any work
    target = load_default_target()
    rows, features_targets = [], {}
    for directory in directories:
        rows.append(measure(target, directory, args.samples, features_targets))
        groups = {k: v for k, v in rows[-1].items() if isinstance(v, dict)}
        print(f"{directory.name}: " + ", ".join(f"{k} tau_prob {v['tau_prob']:.3f} (CE {v['ce']:.2f})"
                                                for k, v in groups.items()))
    if earlier is not None:
        rows = kept_rows(earlier, rows, args.samples)
    payload = {"samples": args.samples, "rows": rows,
               "note": "training's evaluation (fixed anchors, as many per sequence as training took) on held-out "
                       "ShareGPT sequences, on ShareGPT training sequences spread over the split, and on the first "
                       "of each extra pool"}
    print(write_result("generalization_cpu", payload, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
