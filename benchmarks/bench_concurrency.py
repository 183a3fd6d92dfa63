"""Serving load from 1 to 16 concurrent requests: throughput, time to first token and per-token latency, target
alone against DSpark.

A closed loop of ``c`` clients: each sends a request and, when its last token arrives, its next one. The decoders
serve it with continuous batching (``max_batch=c``): a finished request hands its place to the next prompt at the
end of its round, so a request arrives when a place comes free (:class:`dspark.runtime.results.RequestTiming`).
Held-out real prompts (math, code, chat interleaved), greedy, ``--max-new-tokens`` each, on the default target
with the shipped drafter, in the demo's precision. DSpark runs Algorithm 1 (with the demo's back-off) on a
verify-latency profile taken at batch ``c`` before that concurrency's runs, as an engine would at start-up.

Per concurrency, both modes decode the same prompts ``--repeats`` times, taking turns (target alone first in odd
repeats, DSpark first in even ones). One warm-up pair at concurrency 1 runs before anything is timed and is not
counted. Reported per concurrency and mode, each as the median over repeats with the lowest and highest repeat:

* ``output_tokens_per_s``: every request's tokens over the run's wall time (prefills included);
* ``request_tokens_per_s``: the median over requests of its tokens over its time from arrival to last token;
* ``ttft_p50_ms`` / ``ttft_p90_ms``: time from arrival to first token (queued prefills included);
* ``tpot_ms``: the median over requests of (last token − first token) / (tokens − 1), the inter-token latency;

and whether the two modes' outputs are identical. Run it on an idle machine: the times are wall-clock.

    python benchmarks/bench_concurrency.py [--concurrency 1 2 4 8 16] [--prompts-per-domain 8] [--repeats 2]
                                           [--max-new-tokens 64] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.environment import write_result  # noqa: E402
from dspark.demo import BACKOFF, load_demo_drafter, load_demo_target  # noqa: E402
from dspark.runtime.decoding import SamplingConfig, generate, speculative_generate  # noqa: E402
from dspark.runtime.profiling import choose_few_row_layout  # noqa: E402
from dspark.runtime.prompts import load_prompt_mix  # noqa: E402
from dspark.runtime.results import GenerationResult  # noqa: E402
from dspark.scheduler import PrefixScheduler  # noqa: E402

MODES = ("target_only", "dspark")


def percentile(values: list[float], q: float) -> float:
    """The ``q``-quantile of ``values`` by linear interpolation between order statistics."""
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def load_metrics(result: GenerationResult) -> dict:
    """Throughput and latency of one decode of the whole queue."""
    times, tokens = result.request_timings, [len(t) for t in result.tokens]
    ttft = [1000 * t.time_to_first_token for t in times]
    return {"output_tokens_per_s": result.new_tokens / result.seconds,
            "request_tokens_per_s": statistics.median(n / (t.finished - t.arrived) for n, t in zip(tokens, times)),
            "ttft_p50_ms": percentile(ttft, 0.5), "ttft_p90_ms": percentile(ttft, 0.9),
            "tpot_ms": statistics.median(1000 * (t.finished - t.first_token) / (n - 1)
                                         for n, t in zip(tokens, times) if n > 1)}


def summarise(runs: list[dict]) -> dict:
    """Each metric's median over repeats, with the lowest and highest repeat."""
    return {key: {"median": statistics.median(run[key] for run in runs), "low": min(run[key] for run in runs),
                  "high": max(run[key] for run in runs)} for key in runs[0]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--prompts-per-domain", type=int, default=8)
    parser.add_argument("--offset", type=int, default=50, help="first prompt index (held out from training)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if min(args.concurrency) < 1 or args.repeats < 1 or args.max_new_tokens < 2:
        parser.error("concurrency and repeats must be positive, and --max-new-tokens at least 2")
    target, precision = load_demo_target("auto")
    drafter, description = load_demo_drafter(target)
    print(f"target in {precision}; drafter: {description}", flush=True)
    prompts = [target.encode_chat(p.text) for p in load_prompt_mix(args.prompts_per_domain, args.offset)]
    config = SamplingConfig(max_new_tokens=args.max_new_tokens, temperature=0.0)
    gamma = drafter.config.block_size

    def decode(mode: str, concurrency: int, sps) -> GenerationResult:
        if mode == "target_only":
            return generate(target, prompts, config, max_batch=concurrency)
        return speculative_generate(target, drafter, prompts, config, max_batch=concurrency,
                                    scheduler=PrefixScheduler(sps, backoff=BACKOFF))

    started = time.perf_counter()
    warm_sps = choose_few_row_layout(target, gamma + 1, requests=1)
    for mode in MODES:  # warm-up: first calls allocate caches and pick kernels
        decode(mode, 1, warm_sps)
    rows = []
    for concurrency in args.concurrency:
        sps = choose_few_row_layout(target, concurrency * (gamma + 1), requests=concurrency)
        runs = {mode: [] for mode in MODES}
        for repeat in range(args.repeats):
            for mode in MODES if repeat % 2 == 0 else MODES[::-1]:
                runs[mode].append(decode(mode, concurrency, sps))
        row = {"concurrency": concurrency, "prompts": len(prompts),
               "identical_outputs": all(a.tokens == b.tokens for a, b in zip(*runs.values())),
               "tau": statistics.median(r.stats.tau for r in runs["dspark"])}
        for mode, results in runs.items():
            row[mode] = summarise([load_metrics(r) for r in results])
        row["speedup"] = row["dspark"]["output_tokens_per_s"]["median"] / \
            row["target_only"]["output_tokens_per_s"]["median"]
        rows.append(row)
        print(f"concurrency {concurrency}: " + "; ".join(
            f"{mode} {row[mode]['output_tokens_per_s']['median']:.1f} tok/s, TTFT p50 "
            f"{row[mode]['ttft_p50_ms']['median']:.0f} ms p90 {row[mode]['ttft_p90_ms']['median']:.0f} ms, TPOT "
            f"{row[mode]['tpot_ms']['median']:.1f} ms" for mode in MODES)
            + f"; speedup {row['speedup']:.2f}x, tau {row['tau']:.2f}, identical {row['identical_outputs']} "
            f"[{time.perf_counter() - started:.0f} s]", flush=True)
    path = write_result("concurrency_cpu", {"drafter": description, "precision": precision,
                                            "max_new_tokens": args.max_new_tokens, "repeats": args.repeats,
                                            "warm_up": "one decode per mode at concurrency 1, not counted",
                                            "rows": rows}, args.out)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
