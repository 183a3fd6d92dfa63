"""Speculative vs target-only decoding with the default target, batch 1 and 4, static and continuous, in one run.

Greedy decoding of held-out real prompts (math, code, chat) with SmolLM2-135M-Instruct; the drafter is ``--drafter
PATH``, else the trained one when available (``dspark.files.checkpoint.find_default_drafter``), else an untrained one,
and the result says which. Speculative decoding runs twice per batch: verifying every drafted slot, and with Algorithm 1
(with the demo's back-off) on a verify-latency profile taken at that batch, as an engine would at start-up; that
profiling also keeps the fastest layout of few-row products on this CPU
(``dspark.runtime.profiling.choose_few_row_layout``), for all three modes. The target and drafter run in
``--precision`` (default auto: bf16 where this CPU multiplies bf16 faster, with invariant attention,
``dspark.runtime.invariant``). A bf16 run also times the fp32 target alone on the same prompts, in the same rotation,
so that its speedup can be read against fp32 plain decoding as well (``fp32_target_only_tokens_per_s``; those outputs
differ by bf16 rounding and are not compared). The modes take turns, chunk of prompts by chunk. Batch 4 runs twice: in
static chunks of 4 prompts, where a chunk's last rounds run with the requests that have not finished yet, and with
continuous batching (``max_batch=4``: a finished request hands its place to the next prompt, as a serving engine keeps
its batch full), where each mode decodes all the prompts twice, in mirrored order (``batching`` in each row says
which). Reports tokens/s of both modes, their ratio, τ and per-position acceptance, what a round costs in units of one
plain target step at the same batch (draft, schedule, the verify pass's forward, verification with its cache updates,
bookkeeping), the profile, and checks the outputs are identical. Writes
``e2e_cpu.json`` (or ``_gpu``; ``--tag NAME`` appends ``_NAME``, to keep another drafter's or machine's run apart
from the one the paper reads).

    python benchmarks/bench_e2e.py [--prompts-per-domain 3] [--max-new-tokens 64] [--drafter PATH] [--tag NAME]
                                   [--precision auto|bf16|fp32] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.environment import write_result  # noqa: E402
from dspark.demo import BACKOFF, load_demo_drafter, load_demo_target  # noqa: E402
from dspark.linear import describe_layout, skinny_layout, skinny_rows  # noqa: E402
from dspark.runtime.decoding import SamplingConfig, generate, speculative_generate  # noqa: E402
from dspark.runtime.profiling import choose_few_row_layout  # noqa: E402
from dspark.runtime.prompts import load_prompt_mix  # noqa: E402
from dspark.scheduler import FixedLength, PrefixScheduler  # noqa: E402


def _row(batch, batching, scheduler, sps, plain_runs, spec_runs, plain_s, step_s, num_prompts, fp32_runs,
         layout) -> dict:
    stats = spec_runs[0].stats
    for run in spec_runs[1:]:
        stats = stats.merge(run.stats)
    spec_s = sum(r.seconds for r in spec_runs)
    new = sum(r.new_tokens for r in spec_runs)
    rounds = sum(r.steps for r in spec_runs)
    parts = {k: sum(r.timings[k] for r in spec_runs) / rounds / step_s
             for k in ("draft", "schedule", "target", "verify", "bookkeeping")}
    row = {"batch": batch, "batching": batching, "scheduler": scheduler, "prompts": num_prompts, "new_tokens": new,
           "target_only_tokens_per_s": new / plain_s, "speculative_tokens_per_s": new / spec_s,
           "speedup": plain_s / spec_s,
           "identical_outputs": [t for r in plain_runs for t in r.tokens] == [t for r in spec_runs for t in r.tokens],
           "target_step_ms": 1000 * step_s, "round_in_target_steps": sum(parts.values()),
           "round_parts_in_target_steps": parts,
           "rounds_without_drafts": sum(r.rounds_without_drafts for r in spec_runs),
           "verify_pass_ms": {b: 1000 / sps(b) for b in range(batch, sps.max_tokens + 1)},
           "skinny_rows": skinny_rows(), "skinny_layout": skinny_layout(),
           "few_row_layout": layout, **stats.as_dict()}
    if fp32_runs:
        row["fp32_target_only_tokens_per_s"] = sum(r.new_tokens for r in fp32_runs) / sum(r.seconds for r in fp32_runs)
        row["speedup_over_fp32_target_only"] = row["speculative_tokens_per_s"] / row["fp32_target_only_tokens_per_s"]
    print(f"batch {batch} ({batching}), {scheduler}: target-only {row['target_only_tokens_per_s']:.1f} tok/s, "
          f"speculative {row['speculative_tokens_per_s']:.1f} tok/s, speedup {row['speedup']:.2f}x, "
          f"tau {stats.tau:.2f}, identical {row['identical_outputs']}; "
          f"a round costs {row['round_in_target_steps']:.2f} target steps "
          f"({', '.join(f'{k} {v:.2f}' for k, v in parts.items())})"
          + (f"; fp32 target-only {row['fp32_target_only_tokens_per_s']:.1f} tok/s" if fp32_runs else ""), flush=True)
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts-per-domain", type=int, default=3)
    parser.add_argument("--offset", type=int, default=50, help="first prompt index (held out from training)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--drafter", type=Path, default=None, help="a drafter checkpoint directory")
    parser.add_argument("--tag", default=None, help="writes e2e_<device>_<tag>.json")
    parser.add_argument("--precision", choices=["auto", "bf16", "fp32"], default="auto")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.tag is not None and not re.fullmatch(r"[A-Za-z0-9-]+", args.tag):
        parser.error(f"--tag takes letters, digits and dashes, got {args.tag!r}")
    target, precision = load_demo_target(args.precision)
    drafter, description = load_demo_drafter(target, args.drafter)
    print(f"target in {precision}; drafter: {description}", flush=True)
    fp32_target = load_demo_target("fp32")[0] if target.dtype == torch.bfloat16 else None
    prompts = [target.encode_chat(p.text) for p in load_prompt_mix(args.prompts_per_domain, args.offset)]
    config = SamplingConfig(max_new_tokens=args.max_new_tokens, temperature=0.0)
    gamma = drafter.config.block_size
    rows = []
    for batch, batching in ((1, "static"), (4, "static"), (4, "continuous")):
        if batching == "static":  # the continuous run keeps the profile and layout taken at its batch
            sps = choose_few_row_layout(target, batch * (gamma + 1), requests=batch)
        schedulers = {"every slot": lambda: FixedLength(gamma),
                      "algorithm-1": lambda sps=sps: PrefixScheduler(sps, backoff=BACKOFF)}
        plain_runs, spec_runs, fp32_runs = [], {name: [] for name in schedulers}, []
        if batching == "static":
            # The modes take turns chunk by chunk, so that the machine's drift in speed during the run (10% on a
            # shared CPU) reaches all of them alike instead of favouring whichever ran in a fast stretch.
            turns = [(prompts[i: i + batch], ["plain", "fp32", *schedulers]) for i in range(0, len(prompts), batch)]
            max_batch = None
        else:
            # Each mode decodes every prompt in one continuous batch, twice, in mirrored order.
            modes = ["plain", *schedulers]
            turns = [(prompts, modes), (prompts, modes[::-1])]
            max_batch = batch
        for chunk, modes in turns:
            for mode in modes:
                if mode == "plain":
                    plain_runs.append(generate(target, chunk, config, max_batch=max_batch))
                elif mode == "fp32":
                    if fp32_target is not None:
                        fp32_runs.append(generate(fp32_target, chunk, config))
                else:
                    spec_runs[mode].append(speculative_generate(target, drafter, chunk, config,
                                                                scheduler=schedulers[mode](), max_batch=max_batch))
        # One target step: a plain decoding step at this batch. A round's parts are given in those units.
        step_s = sum(r.timings["decode"] for r in plain_runs) / sum(r.steps for r in plain_runs)
        plain_s = sum(r.seconds for r in plain_runs)
        for name, runs in spec_runs.items():
            rows.append(_row(batch, batching, name, sps, plain_runs, runs, plain_s, step_s, len(prompts), fp32_runs,
                             describe_layout(target.dtype)))
    device = "gpu" if torch.cuda.is_available() else "cpu"
    name = f"e2e_{device}" + (f"_{args.tag}" if args.tag else "")
    path = write_result(name, {"drafter": description, "drafter_config": drafter.config.to_dict(),
                               "precision": precision, "dtype": str(target.dtype).removeprefix("torch."),
                               "max_new_tokens": args.max_new_tokens, "rows": rows}, args.out)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
