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
    flags = {"objective": args.objective, "steps": args.steps, "num_prompts": args.prompts,
             "num_draft_layers": args.layers, "block_size": args.block_size, "precision": args.precision,
             "ce_weight": args.ce_weight, "l1_weight": args.l1_weight, "continue_from": args.continue_from,
             "features": args.features}
    return {k: v for k, v in flags.items() if v is not None}


# dspark.pipeline.POOL_NAMES but "sampled", spelled out so that parsing arguments does not import torch.
GROWABLE_POOLS = ("code", "math", "math2", "math3", "code2", "followup")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dspark", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("example", help="draft one block with a small random drafter")
    demo = sub.add_parser("demo", help="decode real prompts with the default target, alone and with DSpark")
    demo.add_argument("--per-domain", type=int, default=2, help="prompts per domain (math, code, chat)")
    demo.add_argument("--max-new-tokens", type=int, default=64)
    demo.add_argument("--drafter", default=None,
                      help="a drafter directory (default: the one `train` wrote to the cache, else the shipped one)")
    demo.add_argument("--precision", choices=["auto", "bf16", "fp32"], default="auto",
                      help="the target's and drafter's dtype (default auto: bf16 where this machine runs it faster "
                           "than fp32, with invariant attention so outputs match exactly)")
    train = sub.add_parser("train", help="train a drafter for the default target on the CPU (cached data)")
    train.add_argument("--config", default=None,
                       help="a recipe: a JSON file of the settings its phases share (objective, num_draft_layers, "
                            "block_size, markov_rank, num_anchors, ...), its prompt pools and its phases (see "
                            "dspark.recipe); every phase runs in turn, finished ones skipped. Flags given override "
                            "its settings in every phase")
    train.add_argument("--arm", default=None,
                       help="one of the recipe's arms (e.g. dflash): its first phases, with the arm's settings")
    train.add_argument("--objective", choices=["dspark", "dflash", "eagle3"], default=None, help="default dspark")
    train.add_argument("--layers", type=int, default=None, help="draft layers (default 2; eagle3: 1)")
    train.add_argument("--block-size", type=int, default=None, help="γ, the block (or chain) length (default 7)")
    train.add_argument("--steps", type=int, default=None, help="default 4000")
    train.add_argument("--prompts", type=int, default=None,
                       help="size of the ShareGPT prompt pool (default: all, about 7,700); all of them are "
                            "answered unless a config's corpus_samples keeps fewer (a prefix of a seeded shuffle)")
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
    train.add_argument("--output", default=None, help="default: the cache the demo reads")
    answer = sub.add_parser("answer", help="answer more prompts of an extra pool into its answers archive, "
                                           "without training (a later `train` rebuilds them from the archive)")
    answer.add_argument("--pool", required=True, choices=GROWABLE_POOLS)
    answer.add_argument("--prompts", type=int, required=True,
                        help="how many of the pool's prompts the archive should hold (a prefix of its shuffled order)")
    answer.add_argument("--archive", required=True,
                        help="the pool's answers archive (.npz): the answers it holds are kept, not answered "
                             "again, and it is rewritten holding all --prompts; a missing one is started")
    answer.add_argument("--precision", choices=["auto", "bf16", "fp32"], default=None,
                        help="the answering target's dtype (default: the archive's, or auto for a new archive)")
    average = sub.add_parser("average", help="average the weights of drafters that continued one parent")
    average.add_argument("drafters", nargs="+",
                         help="two or more drafter directories that `train` wrote with one objective, shape and "
                              "held-out split (e.g. continuations of one drafter)")
    average.add_argument("--output", required=True)
    export = sub.add_parser("export", help="write a trained drafter in the speculators format vLLM serves")
    export.add_argument("--drafter", default=None, help="dspark drafter directory (default: the demo's)")
    export.add_argument("--out", required=True)
    export.add_argument("--verifier", default="HuggingFaceTB/SmolLM2-135M-Instruct",
                        help="the target as the serving engine should load it")
    export.add_argument("--architectures", nargs="+", default=["LlamaForCausalLM"])
    args = parser.parse_args(argv)
    if args.command == "export":
        from dspark.checkpoint import default_drafter_dir, find_default_drafter, load_drafter
        from dspark.export import export as export_drafter
        from dspark.target import load_default_target

        target = load_default_target()
        drafter = load_drafter(args.drafter, target) if args.drafter else find_default_drafter(target)
        if drafter is None:
            raise SystemExit(f"no trained drafter at {default_drafter_dir()}: run `python -m dspark train` first")
        path = export_drafter(drafter, args.out, verifier_name_or_path=args.verifier,
                              verifier_architectures=args.architectures)
        print(f"wrote {path}: serve it with `vllm serve {path}`")
        return 0
    if args.command == "answer":
        from dspark.pipeline import answer_pool
        from dspark.training import tune_cpu_allocator

        tune_cpu_allocator()
        done = answer_pool(args.pool, args.prompts, args.archive, precision=args.precision)
        print(f"{done['archive']}: {done['prompts_before']:,} → {done['prompts']:,} prompts, "
              f"{done['answer_tokens_before']:,} → {done['answer_tokens']:,} answer tokens in {done['seconds']:,.0f} s "
              f"(features under {done['corpus']})")
        return 0
    if args.command == "average":
        from dspark.pipeline import average_drafters

        path = average_drafters(args.drafters, args.output)
        print(f"wrote {path}")
        return 0
    if args.command == "train":
        from dspark.checkpoint import default_drafter_dir
        from dspark.pipeline import loss_weights_suffix, train_default_drafter
        from dspark.recipe import load_recipe, run_recipe
        from dspark.training import tune_cpu_allocator

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

    return run_demo(args.per_domain, args.max_new_tokens, args.drafter, args.precision)


if __name__ == "__main__":
    sys.exit(main())
