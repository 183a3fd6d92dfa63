"""Speculative vs target-only decoding with the default target, batch 1 and 4, in one run.

Greedy decoding of held-out real prompts (math, code, chat) with SmolLM2-135M-Instruct; the drafter is
the trained one when available (``dspark.checkpoint.find_default_drafter``), else an untrained one, and
the result says which. Reports tokens/s of both modes, their ratio, τ and per-position acceptance, and
checks the outputs are identical. Writes ``benchmarks/results/e2e_cpu.json`` (or ``_gpu``).

    python benchmarks/bench_e2e.py [--prompts-per-domain 3] [--max-new-tokens 64]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.environment import write_result  # noqa: E402
from dspark.data import load_prompt_mix  # noqa: E402
from dspark.decoding import SamplingConfig, generate, speculative_generate  # noqa: E402
from dspark.demo import load_demo_drafter  # noqa: E402
from dspark.scheduler import FixedLength  # noqa: E402
from dspark.target import load_default_target  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts-per-domain", type=int, default=3)
    parser.add_argument("--offset", type=int, default=50, help="first prompt index (held out from training)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    target = load_default_target()
    drafter, description = load_demo_drafter(target)
    prompts = [target.encode_chat(p.text) for p in load_prompt_mix(args.prompts_per_domain, args.offset)]
    config = SamplingConfig(max_new_tokens=args.max_new_tokens, temperature=0.0)
    rows = []
    for batch in (1, 4):
        plain_tokens, spec_tokens, plain_s, spec_s = [], [], 0.0, 0.0
        stats = None
        for i in range(0, len(prompts), batch):
            chunk = prompts[i: i + batch]
            plain = generate(target, chunk, config)
            spec = speculative_generate(target, drafter, chunk, config,
                                        scheduler=FixedLength(drafter.config.block_size))
            plain_tokens += plain.tokens
            spec_tokens += spec.tokens
            plain_s += plain.seconds
            spec_s += spec.seconds
            stats = spec.stats if stats is None else stats.merge(spec.stats)
        new = sum(len(t) for t in spec_tokens)
        row = {"batch": batch, "prompts": len(prompts), "new_tokens": new,
               "target_only_tokens_per_s": new / plain_s, "speculative_tokens_per_s": new / spec_s,
               "speedup": plain_s / spec_s, "identical_outputs": plain_tokens == spec_tokens, **stats.as_dict()}
        rows.append(row)
        print(f"batch {batch}: target-only {row['target_only_tokens_per_s']:.1f} tok/s, speculative "
              f"{row['speculative_tokens_per_s']:.1f} tok/s, speedup {row['speedup']:.2f}x, tau {stats.tau:.2f}, "
              f"identical {row['identical_outputs']}")
    device = "gpu" if torch.cuda.is_available() else "cpu"
    path = write_result(f"e2e_{device}", {"drafter": description, "drafter_config": drafter.config.to_dict(),
                                          "max_new_tokens": args.max_new_tokens, "rows": rows}, args.out)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
