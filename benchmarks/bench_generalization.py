"""How much better a trained drafter predicts the sequences it trained on than held-out ones.

Training's held-out evaluation (τ_prob, CE and L1 at fixed anchors, as :meth:`dspark.training.Trainer.evaluate`)
is run on the recipe's ShareGPT corpus and pools: the held-out sequences (the highest prompt indices, which
training evaluates on), ``--samples`` training sequences spread evenly over the rest, and the first ``--samples``
of each extra prompt pool the drafter trained on (all of which train). A large gap between the first two means
the drafter memorises its data, which more data or regularisation (the recipe's ``dropout``) addresses; no gap
would mean it is too small to fit even what it saw. A mean of drafters' weights (``python -m dspark average``) is
measured like any drafter, on every pool one of its ingredients trained on.

The corpora are read from the recipe's cache: run the recipe's config first (``python -m dspark train --config
benchmarks/recipes/<pass>.json``), which answers or rebuilds them. Writes ``generalization_cpu.json``.

    python benchmarks/bench_generalization.py [DRAFTER_DIR ...] [--samples 48] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.environment import write_result  # noqa: E402
from dspark.checkpoint import load_drafter, read_checkpoint_config, shipped_drafter_dir  # noqa: E402
from dspark.corpus import corpus_order, load_corpus  # noqa: E402
from dspark.data import held_out_followups, load_training_prompts  # noqa: E402
from dspark.target import load_default_target  # noqa: E402
from dspark.training import (  # noqa: E402
    OfflineFeatures,
    TrainConfig,
    Trainer,
    code2_corpus_dir,
    code_corpus_dir,
    followup_corpus_dir,
    math2_corpus_dir,
    math3_corpus_dir,
    math_corpus_dir,
    recipe_sharegpt_split,
    sampled_corpus_dir,
)

# Each extra pool's corpus, from the ShareGPT corpus's directory and the drafter's training arguments.
POOLS = {"code": lambda d, _: code_corpus_dir(d), "math": lambda d, _: math_corpus_dir(d),
         "math2": lambda d, _: math2_corpus_dir(d), "math3": lambda d, _: math3_corpus_dir(d),
         "code2": lambda d, _: code2_corpus_dir(d),
         "sampled": lambda d, arguments: sampled_corpus_dir(d, arguments["sampled_temperature"]),
         "followup": lambda d, _: followup_corpus_dir(d)}


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


def evaluate(target, drafter, directory: Path, samples, arguments: dict, precision: str) -> dict:
    """Training's evaluation of ``drafter`` on ``samples`` of the corpus at ``directory``, with the anchors per
    sequence of its training ``arguments``."""
    source = OfflineFeatures(directory, target.tap_layers, target.hidden_size)
    config = TrainConfig(num_anchors=arguments["num_anchors"], precision=precision, objective="dspark")
    result = Trainer(drafter, target.lm_head_weight(), source, samples, config, held_out=samples).evaluate()
    return {"sequences": len(samples), "tau_prob": result["eval_tau_prob"], "ce": result["eval_ce"],
            "l1": result["eval_l1"], "slot1_accuracy": result["eval_accuracy"][0]}


def measure(target, directory: Path, count: int) -> dict:
    """The groups' scores for the drafter at ``directory``, which the recipe must have trained on corpora that are
    in the cache."""
    meta = read_checkpoint_config(directory).get("metadata", {})
    run = meta.get("run", {})
    arguments = run.get("arguments")
    if not arguments or arguments.get("objective") != "dspark":
        raise SystemExit(f"{directory}: not a DSpark drafter the recipe trained (no training record)")
    precision = run["train_config"]["precision"]
    try:
        corpus, train, held_out = recipe_sharegpt_split(arguments, precision)
    except ValueError as error:
        raise SystemExit(str(error)) from None
    prompts = load_training_prompts(arguments["num_prompts"])
    drafter = load_drafter(directory, target)
    row = {"drafter": directory.name, "steps": meta.get("steps"), "lr": arguments.get("lr"),
           "layers": drafter.config.num_draft_layers, "dropout": arguments.get("dropout", 0.0),
           "sampled_prompts": arguments.get("sampled_prompts", 0),
           "sampled_temperature": arguments.get("sampled_temperature") if arguments.get("sampled_prompts") else None,
           "followup_prompts": arguments.get("followup_prompts", 0),
           "average_of": [a["directory"] for a in meta.get("average_of", [])],
           "held_out": evaluate(target, drafter, corpus, held_out, arguments, precision),
           "train": evaluate(target, drafter, corpus, spread(train, count), arguments, precision),
           "recorded_held_out_tau_prob": meta.get("final", {}).get("eval_tau_prob"),
           "last_run_curve": last_run_curve(meta)}
    for name, pool_dir in POOLS.items():
        if arguments.get(f"{name}_prompts"):
            directory = pool_dir(corpus, arguments)
            # The pool's corpus answered the first <pool>_prompts of its own shuffled order.
            pool_size = json.loads((directory / "corpus.json").read_text(encoding="utf-8"))["settings"]["num_prompts"]
            keys = corpus_order(pool_size)[: arguments[f"{name}_prompts"]]
            if name == "followup":  # training left out the turns of held-out conversations
                dropped = held_out_followups({prompts[s.key] for s in held_out})
                keys = [key for key in keys if key not in dropped]
            row[f"{name}_train"] = evaluate(target, drafter, directory, load_corpus(directory, keys[:count]),
                                            arguments, precision)
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("drafters", nargs="*", type=Path, help="drafter directories (default: the shipped one)")
    parser.add_argument("--samples", type=int, default=48, help="training sequences per group")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.samples < 1:
        raise SystemExit("--samples must be positive")
    target = load_default_target()
    rows = []
    for directory in args.drafters or [shipped_drafter_dir()]:
        rows.append(measure(target, directory, args.samples))
        groups = {k: v for k, v in rows[-1].items() if isinstance(v, dict)}
        print(f"{directory.name}: " + ", ".join(f"{k} tau_prob {v['tau_prob']:.3f} (CE {v['ce']:.2f})"
                                                for k, v in groups.items()))
    payload = {"samples": args.samples, "rows": rows,
               "note": "training's evaluation (fixed anchors, as many per sequence as training took) on held-out "
                       "ShareGPT sequences, on ShareGPT training sequences spread over the split, and on the first "
                       "of each extra pool"}
    print(write_result("generalization_cpu", payload, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
