"""Command line: ``python -m dspark example`` (or the ``dspark`` console script)."""

from __future__ import annotations

import argparse
import sys


def example() -> None:
    """Draft one block per request with a small random drafter and show what each component produced."""
    import torch

    from dspark import DSparkConfig, DSparkDrafter
    from dspark.testing import randomize_

    torch.manual_seed(0)
    config = DSparkConfig(
        vocab_size=101, hidden_size=32, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
        num_target_layers=8, target_layer_ids=[1, 3, 5], mask_token_id=100, block_size=7, num_draft_layers=2,
        markov_rank=16,
    )
    drafter = randomize_(DSparkDrafter(config), seed=0, std=0.3).eval()
    requests, context = 3, 10
    features = torch.randn(requests, context, config.num_taps * config.hidden_size)
    cache = drafter.new_cache(requests)
    drafter.extend_cache(cache, features, torch.tensor([10, 6, 3]))
    anchors = torch.tensor([5, 17, 42])
    out = drafter.draft(anchors, cache, torch.rand(requests, config.block_size), temperature=1.0)
    print(f"DSpark drafter (random weights): γ={config.block_size}, {config.num_draft_layers} layers, "
          f"vanilla Markov rank {config.markov_rank}, vocabulary {config.vocab_size}")
    for r in range(requests):
        picked = out.draft_probs[r].gather(-1, out.tokens[r, :, None]).squeeze(-1)
        print(f"request {r}: context {int(cache.lengths[r])} rows, anchor {int(anchors[r])}")
        print(f"  drafted tokens     {out.tokens[r].tolist()}")
        print(f"  q(token)           {[round(float(p), 3) for p in picked]}")
        print(f"  confidence c_k     {[round(float(c), 3) for c in out.confidence[r]]}")
        print(f"  survival a_k       {[round(float(a), 3) for a in out.survival[r]]}")


def _train_flags(args) -> dict:
    """The settings the ``train`` flags given set (they override the config file's, in every phase)."""
    flags = {"objective": args.objective, "steps": args.steps, "num_prompts": args.num_prompts,
             "num_draft_layers": args.layers, "block_size": args.block_size, "precision": args.precision,
             "ce_weight": args.ce_weight, "l1_weight": args.l1_weight, "continue_from": args.continue_from,
             "features": args.features}
    return {k: v for k, v in flags.items() if v is not None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dspark", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("example", help="draft one block with a small random drafter")
    demo = sub.add_parser("demo", help="decode real prompts with the default target, alone and with DSpark")
    demo.add_argument("--per-domain", type=int, default=2, help="prompts per domain (math, code, chat)")
    demo.add_argument("--max-new-tokens", type=int, default=64)
    demo.add_argument("--drafter", default=None,
                      help="a drafter directory, e.g. one `train` wrote (default: the one shipped in the package)")
    demo.add_argument("--precision", choices=["auto", "bf16", "fp32"], default="auto",
                      help="the target's and drafter's dtype (default auto: bf16 where this machine runs it faster "
                           "than fp32, with invariant attention so outputs match exactly)")
    demo.add_argument("--target", default=None,
                      help="a local Hugging Face model directory to decode with instead of the default target "
                           "(give its drafter with --drafter)")
    demo.add_argument("--gguf-file", default=None, help="with --target: a GGUF file inside that directory")
    train = sub.add_parser("train", help="train a drafter: for your own model with --target and --prompts, else for "
                                         "the default target by its recipe")
    train.add_argument("--target", default=None,
                       help="a local Hugging Face model directory (config, weights, tokenizer) to train a drafter for; "
                            "without it, the default target (SmolLM2-135M-Instruct)")
    train.add_argument("--gguf-file", default=None, help="with --target: a GGUF file inside that directory")
    train.add_argument("--prompts", default=None,
                       help="with --target: a prompt file (.jsonl of strings, {\"prompt\": ...} or {\"messages\": "
                            "[...]}; .json list; or one prompt a line) or a packaged set: sharegpt, code, math")
    train.add_argument("--plain-text", action="store_true",
                       help="with --target: feed prompts as plain text, not through the chat template (base models)")
    train.add_argument("--max-new-tokens", type=int, default=None, help="with --target: answer length (default 128)")
    train.add_argument("--held-out", type=int, default=None,
                       help="with --target: prompts kept out of training to measure τ_prob and calibrate STS "
                            "(default a tenth, at most 48)")
    train.add_argument("--draft-vocab", type=int, default=None,
                       help="with --target: the drafter's vocabulary, the most frequent answer tokens (default: the "
                            "target's up to 32,768 tokens, else 32,768)")
    train.add_argument("--checkpoint-every", type=int, default=None,
                       help="with --target: checkpoint every N steps (default 200)")
    train.add_argument("--checkpoint-minutes", type=float, default=None,
                       help="with --target: checkpoint at least every M minutes (default 10)")
    train.add_argument("--keep-checkpoints", action="store_true",
                       help="with --target: keep the last training checkpoint after the drafter is written")
    train.add_argument("--config", default=None,
                       help="a recipe: a JSON file of the settings its phases share (objective, num_draft_layers, "
                            "block_size, markov_rank, num_anchors, ...), its prompt pools and its phases (see "
                            "dspark.train.recipe); every phase runs in turn, finished ones skipped. Flags given "
                            "override its settings in every phase")
    train.add_argument("--arm", default=None,
                       help="one of the recipe's arms (e.g. dflash): its first phases, with the arm's settings")
    train.add_argument("--objective", choices=["dspark", "dflash", "eagle3"], default=None, help="default dspark")
    train.add_argument("--layers", type=int, default=None, help="draft layers (default 2; eagle3: 1)")
    train.add_argument("--block-size", type=int, default=None, help="γ, the block (or chain) length (default 7)")
    train.add_argument("--steps", type=int, default=None, help="default 4000; with --target 2000")
    train.add_argument("--num-prompts", type=int, default=None,
                       help="how many prompts to answer: with --target, of --prompts (default all); else the size of "
                            "the ShareGPT pool (default: all, about 7,700), all answered unless a config's "
                            "corpus_samples keeps fewer (a prefix of a seeded shuffle)")
    train.add_argument("--precision", choices=["auto", "bf16", "fp32"], default=None,
                       help="the answering target's and the training's dtype (default auto: bf16 where this "
                            "machine runs it faster than fp32)")
    train.add_argument("--ce-weight", type=float, default=None,
                       help="dspark objective: the cross-entropy term's weight (default 0.1)")
    train.add_argument("--l1-weight", type=float, default=None,
                       help="dspark objective: the L1 (distribution-matching) term's weight (default 0.9)")
    train.add_argument("--continue-from", default=None,
                       help="a drafter directory this command wrote (same objective and data): train it further, "
                            "the learning-rate schedule starting over and the data picking up where it stopped; "
                            "with more --layers than it has, layers that start out adding nothing are stacked on top")
    train.add_argument("--features", choices=["eager", "lazy"], default=None,
                       help="eager (default): rebuild the features of every archived answer before training; lazy: "
                            "compute each when training first reads it, so a run pays only for what it reads")
    train.add_argument("--output", default=None,
                       help="where the drafter goes (required with --target; default for the default target: "
                            "$DSPARK_CACHE/drafters/<run name>, announced at start)")
    answer = sub.add_parser("answer", help="answer more prompts of an extra pool into its answers archive, "
                                           "without training (a later `train` rebuilds them from the archive)")
    answer.add_argument("--config", default=None, help="a recipe (JSON file) whose pools name --pool")
    answer.add_argument("--pool", default=None, help="with --config: the pool's name in the recipe")
    answer.add_argument("--source", default=None,
                        help="without --config: the pool's kind of source (stdlib-code, word-problems, "
                             "sharegpt-followups, file)")
    answer.add_argument("--series", type=int, default=1, help="with --source: its series (stdlib-code: 1-2, "
                                                              "word-problems: 1-3)")
    answer.add_argument("--path", default=None, help="with --source file: the prompt file")
    answer.add_argument("--prompts", type=int, required=True,
                        help="how many of the pool's prompts the archive should hold (a prefix of its shuffled order)")
    answer.add_argument("--archive", default=None,
                        help="the answers archive (.npz; default: the one the recipe names for the pool): the "
                             "answers it holds are kept, not answered again, and it is rewritten holding all "
                             "--prompts; a missing one is started")
    answer.add_argument("--precision", choices=["auto", "bf16", "fp32"], default=None,
                        help="the answering target's dtype (default: the archive's, or auto for a new archive)")
    average = sub.add_parser("average", help="average the weights of drafters that continued one parent")
    average.add_argument("drafters", nargs="+",
                         help="two or more drafter directories that `train` wrote with one objective, shape and "
                              "held-out split (e.g. continuations of one drafter)")
    average.add_argument("--output", required=True)
    export = sub.add_parser("export", help="write a trained drafter in the speculators format vLLM serves")
    export.add_argument("--drafter", default=None,
                        help="dspark drafter directory for the default target (default: the shipped one)")
    export.add_argument("--out", required=True)
    export.add_argument("--verifier", default="HuggingFaceTB/SmolLM2-135M-Instruct",
                        help="the target as the serving engine should load it")
    export.add_argument("--architectures", nargs="+", default=["LlamaForCausalLM"])
    args = parser.parse_args(argv)
    if args.command == "export":
        from dspark.files.checkpoint import load_drafter, shipped_drafter_dir
        from dspark.files.export import SPECULATORS_VERSION
        from dspark.files.export import export as export_drafter
        from dspark.runtime.target import load_default_target

        target = load_default_target()
        drafter = load_drafter(args.drafter or shipped_drafter_dir(), target)
        path = export_drafter(drafter, args.out, verifier_name_or_path=args.verifier,
                              verifier_architectures=args.architectures)
        print(f"wrote {path} in the speculators format (its config and tensors are what speculators "
              f"{SPECULATORS_VERSION}'s DSpark classes read; dspark's tests check that round trip, not a vLLM server)")
        return 0
    if args.command == "answer":
        from dspark.runtime.machine import tune_cpu_allocator
        from dspark.train.pipeline import answer_pool
        from dspark.train.pools import PoolSpec
        from dspark.train.recipe import recipe_pool

        if (args.config is None) == (args.source is None) or (args.config is None) != (args.pool is None):
            parser.error("answer takes a recipe's pool (--config and --pool) or a source (--source)")
        try:
            pool = recipe_pool(args.config, args.pool) if args.config else \
                PoolSpec(args.source, args.source, series=args.series, path=args.path)
            archive = args.archive or pool.answers
            if archive is None:
                parser.error("no answers archive: give --archive" + (" (the recipe names none for the pool)"
                                                                      if args.config else ""))
            tune_cpu_allocator()
            done = answer_pool(pool, args.prompts, archive, precision=args.precision)
        except ValueError as error:
            raise SystemExit(f"dspark answer: {error}") from error
        print(f"{done['archive']}: {done['prompts_before']:,} → {done['prompts']:,} prompts, "
              f"{done['answer_tokens_before']:,} → {done['answer_tokens']:,} answer tokens in {done['seconds']:,.0f} s "
              f"(features under {done['corpus']})")
        return 0
    if args.command == "average":
        from dspark.train.pipeline import average_drafters

        path = average_drafters(args.drafters, args.output)
        print(f"wrote {path}")
        return 0
    if args.command == "train" and args.target is not None:
        return _train_for_target(args, parser)
    if args.command == "train":
        only = [flag for flag, name in TARGET_ONLY if getattr(args, name)]
        if only:
            parser.error(f"{', '.join(only)} apply to training for your own model: give it with --target")
        from dspark.files.checkpoint import default_drafter_dir
        from dspark.runtime.machine import tune_cpu_allocator
        from dspark.train.pipeline import loss_weights_suffix, train_default_drafter
        from dspark.train.recipe import load_recipe, run_recipe

        flags = _train_flags(args)
        if args.arm and not args.config:
            raise SystemExit("--arm names an arm of a recipe: give the recipe with --config")
        try:
            phases = load_recipe(args.config, args.arm) if args.config else [{}]
        except ValueError as error:
            raise SystemExit(str(error)) from error
        if "steps" in flags and len(phases) > 1:
            raise SystemExit(f"{args.config} has {len(phases)} phases, each with its own steps: --steps would "
                             f"override them all; edit the phases instead")
        settings = {"objective": "dspark"} | phases[-1] | flags
        name = f"smollm2-135m-instruct-{settings['objective']}" + \
            loss_weights_suffix(settings.get("ce_weight"), settings.get("l1_weight"))
        output = args.output or default_drafter_dir().with_name(name)
        print(f"writing the drafter to {output}")
        tune_cpu_allocator()
        if args.config:
            path = run_recipe(args.config, output, arm=args.arm, overrides=flags)
        else:
            path = train_default_drafter(output, **settings)
        print(f"wrote {path}")
        return 0
    if args.command == "example":
        example()
        return 0
    from dspark.demo import demo as run_demo

    if args.gguf_file and not args.target:
        parser.error("--gguf-file names a file inside --target's directory: give --target too")
    if args.target and not args.drafter:
        parser.error("--target decodes with a drafter trained for it: give it with --drafter")
    return run_demo(args.per_domain, args.max_new_tokens, args.drafter, args.precision, target_path=args.target,
                    gguf_file=args.gguf_file)


# `train` flags that only training for another target (--target) reads, and those only the default recipe reads.
TARGET_ONLY = (("--prompts", "prompts"), ("--gguf-file", "gguf_file"), ("--plain-text", "plain_text"),
               ("--max-new-tokens", "max_new_tokens"), ("--held-out", "held_out"), ("--draft-vocab", "draft_vocab"),
               ("--checkpoint-every", "checkpoint_every"), ("--checkpoint-minutes", "checkpoint_minutes"),
               ("--keep-checkpoints", "keep_checkpoints"))
RECIPE_ONLY = (("--config", "config"), ("--arm", "arm"), ("--ce-weight", "ce_weight"), ("--l1-weight", "l1_weight"),
               ("--continue-from", "continue_from"), ("--features", "features"))


def _train_for_target(args, parser) -> int:
    """``train --target DIR --prompts FILE --output OUT``: :func:`dspark.train.any_target.train_for_target`."""
    given = [flag for flag, name in RECIPE_ONLY if getattr(args, name) is not None]
    if given:
        parser.error(f"{', '.join(given)} belong to the default target's recipe, not to --target")
    if args.prompts is None or args.output is None:
        parser.error("--target needs --prompts (a prompt file or sharegpt, code, math) and --output")
    from dspark.runtime.machine import tune_cpu_allocator
    from dspark.train.any_target import train_for_target

    options = {"gguf_file": args.gguf_file, "plain_text": args.plain_text, "num_prompts": args.num_prompts,
               "max_new_tokens": args.max_new_tokens, "objective": args.objective, "steps": args.steps,
               "num_draft_layers": args.layers, "block_size": args.block_size, "draft_vocab_size": args.draft_vocab,
               "held_out": args.held_out, "checkpoint_every": args.checkpoint_every,
               "checkpoint_minutes": args.checkpoint_minutes, "precision": args.precision,
               "keep_checkpoints": args.keep_checkpoints}
    tune_cpu_allocator()
    try:
        path = train_for_target(args.target, args.prompts, args.output,
                                **{k: v for k, v in options.items() if v is not None})
    except ValueError as error:
        raise SystemExit(f"dspark train: {error}") from error
    print(f"wrote {path}: decode with it by `python -m dspark demo --target {args.target} --drafter {path}`")
    return 0


if __name__ == "__main__":
    sys.exit(main())
