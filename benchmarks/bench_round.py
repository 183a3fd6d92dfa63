"""What one speculative round costs on a device, in target steps: the τ a drafter must reach to break even.

Speculative decoding speeds decoding up by τ / c, where τ is the tokens a round commits and c what a round
costs in plain target steps at the same batch. ``bench_e2e.py`` measures both with the real target on the CPU;
this measures c anywhere, including on a GPU, where the real weights cannot travel: a random-weight bf16 target
of SmolLM2-135M's shapes and a random drafter of the shipped drafter's shapes (2 layers, γ = 7, Markov rank 32,
a 16,384-token draft vocabulary). Latency does not depend on weight values; acceptance does, so τ here is
about 1 and only c is the result (its break-even τ).

Per batch (1 and 4), on random prompts of ``--prompt-len`` tokens, ``--max-new-tokens`` each, greedy: the
target alone, then speculative decoding verifying every drafted slot with the drafter's kernels on each backend
(``triton`` on a GPU, and ``torch``), taking turns over ``--repeats`` runs (median kept). The round's parts are
host-side times: on a GPU a part that only queues work shows little and the part that waits for it (the
verification's copy back) shows the rest, so on a GPU only their sum is the round's cost.

    python benchmarks/bench_round.py --device cuda [--repeats 3] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_sps import random_model  # noqa: E402
from benchmarks.environment import write_result  # noqa: E402
from dspark.drafter import DSparkDrafter  # noqa: E402
from dspark.runtime.decoding import SamplingConfig, generate, speculative_generate  # noqa: E402
from dspark.runtime.target import TargetModel  # noqa: E402
from dspark.scheduler import FixedLength  # noqa: E402

PARTS = ("draft", "schedule", "target", "verify", "bookkeeping")


def build(device: str, dtype: torch.dtype, draft_vocab: int) -> tuple[TargetModel, DSparkDrafter]:
    """A random-weight target of SmolLM2-135M's shapes and a random drafter of the shipped drafter's shapes."""
    torch.manual_seed(0)
    target = TargetModel(random_model("smollm2-135m", device, dtype))
    drafter = DSparkDrafter(target.drafter_config(block_size=7, num_draft_layers=2, markov_rank=32,
                                                  enable_confidence_head=True, confidence_head_with_markov=True,
                                                  draft_vocab_size=draft_vocab))
    drafter.set_draft_vocab(torch.randperm(target.vocab_size)[:draft_vocab].sort().values)
    drafter.load_target_embeddings(target.embed_weight(), target.lm_head_weight())
    return target, drafter.to(device=device, dtype=dtype).eval()


def measure(target, drafter, batch: int, prompt_len: int, config: SamplingConfig, repeats: int,
            backends: list[str]) -> dict:
    gen = torch.Generator().manual_seed(batch)
    prompts = torch.randint(target.vocab_size, (batch, prompt_len), generator=gen).tolist()
    gamma = drafter.config.block_size
    plain, spec = [], {b: [] for b in backends}
    for _ in range(repeats + 1):  # the first turn warms up (Triton compiles, the allocator grows)
        plain.append(generate(target, prompts, config))
        for backend in backends:
            spec[backend].append(speculative_generate(target, drafter, prompts, config,
                                                      scheduler=FixedLength(gamma), backend=backend))
    plain = plain[1:]
    step_s = statistics.median(r.timings["decode"] / r.steps for r in plain)
    row = {"batch": batch, "prompt_len": prompt_len, "target_step_ms": 1000 * step_s,
           "target_only_tokens_per_s": statistics.median(r.new_tokens / r.seconds for r in plain)}
    for backend, runs in spec.items():
        runs = runs[1:]
        round_s = statistics.median(sum(r.timings[k] for k in PARTS) / r.steps for r in runs)
        row[backend] = {"round_ms": 1000 * round_s, "round_in_target_steps": round_s / step_s,
                        "round_parts_in_target_steps": {k: statistics.median(r.timings[k] / r.steps for r in runs)
                                                        / step_s for k in PARTS},
                        "tau": statistics.median(r.stats.tau for r in runs),
                        "identical_to_target_only": all(r.tokens == p.tokens for r, p in zip(runs, plain))}
        print(f"batch {batch}, {backend}: target step {row['target_step_ms']:.2f} ms, round "
              f"{row[backend]['round_ms']:.2f} ms = {row[backend]['round_in_target_steps']:.2f} target steps "
              f"(break-even tau), identical {row[backend]['identical_to_target_only']}", flush=True)
    if len(backends) == 2:
        row["identical_between_backends"] = all(a.tokens == b.tokens for a, b in zip(*spec.values()))
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cuda")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--draft-vocab", type=int, default=16384)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda, but torch sees no GPU")
    target, drafter = build(args.device, torch.bfloat16, args.draft_vocab)
    backends = ["triton", "torch"] if args.device == "cuda" else ["torch"]
    # A random target emits its EOS about once in 49,152 tokens: requests decode max_new_tokens, and if one
    # does stop early, it stops at the same token in every mode (their outputs are compared).
    config = SamplingConfig(max_new_tokens=args.max_new_tokens, temperature=0.0)
    rows = [measure(target, drafter, b, args.prompt_len, config, args.repeats, backends) for b in args.batches]
    path = write_result(f"round_{args.device}", {"weights": "random", "dtype": "bfloat16",
                                                 "drafter_config": drafter.config.to_dict(),
                                                 "max_new_tokens": args.max_new_tokens, "rows": rows}, args.out)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
