"""Soak: continuous-batching decoding of hundreds of prompts, plain and speculative, with resident memory sampled
through the run.

Writes ``soak_cpu.json``: prompts, whether every prompt's speculative output equals its plain one (greedy), and
per mode the resident-memory samples, their least-squares slope over the run after its first tenth (warm-up:
caches and allocator pools fill), and the total growth. A decoder that leaks (caches of finished requests kept,
statistics tensors growing) shows a slope well above the noise of a flat run.

    python benchmarks/bench_soak.py [--prompts 500] [--max-new-tokens 32] [--max-batch 8] [--out benchmarks/results]
"""

import argparse
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from benchmarks.environment import write_result  # noqa: E402
from dspark.files.checkpoint import load_drafter, shipped_drafter_dir  # noqa: E402
from dspark.runtime.decoding import SamplingConfig, generate, speculative_generate  # noqa: E402
from dspark.runtime.machine import tune_cpu_allocator  # noqa: E402
from dspark.runtime.prompts import DOMAINS, load_prompts  # noqa: E402
from dspark.runtime.target import load_default_target  # noqa: E402
from dspark.scheduler import PrefixScheduler, SPSTable  # noqa: E402
from dspark.train.pools import load_training_prompts  # noqa: E402

WARM_UP_FRACTION = 0.1


def resident_mib() -> float:
    """This process's resident set size, from /proc (no dependency)."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * 4096 / 2**20


class MemorySampler:
    """Samples resident memory every ``interval`` seconds on a thread while a ``with`` block runs."""

    def __init__(self, interval: float = 0.5):
        self.interval, self.samples, self._stop = interval, [], threading.Event()

    def __enter__(self):
        self.start = time.perf_counter()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self):
        while not self._stop.is_set():
            self.samples.append((time.perf_counter() - self.start, resident_mib()))
            self._stop.wait(self.interval)

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def summary(self) -> dict:
        t = np.array([s[0] for s in self.samples])
        rss = np.array([s[1] for s in self.samples])
        kept = t >= WARM_UP_FRACTION * t[-1]
        slope = float(np.polyfit(t[kept], rss[kept], 1)[0]) if kept.sum() >= 3 else float("nan")
        return {"seconds": round(float(t[-1]), 1), "rss_mib_start": round(float(rss[kept][0]), 1),
                "rss_mib_end": round(float(rss[-1]), 1), "rss_mib_max": round(float(rss.max()), 1),
                "rss_slope_mib_per_min": round(60 * slope, 3),
                "rss_growth_after_warm_up_mib": round(float(rss[-1] - rss[kept][0]), 1),
                "samples": [[round(float(a), 1), round(float(b), 1)] for a, b in zip(t[::10], rss[::10])]}


def soak_prompts(count: int) -> list[str]:
    """Every evaluation prompt (math, code, chat: 344), then ShareGPT first turns from the end of the training
    pool's order. What a soak checks (memory, identical outputs) does not depend on whether the drafter saw them."""
    texts = [p.text for domain in DOMAINS for p in load_prompts(domain)]
    return (texts + load_training_prompts()[::-1])[:count]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=500)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--max-batch", type=int, default=8)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if args.prompts < 1:
        parser.error("--prompts must be positive")
    tune_cpu_allocator()
    target = load_default_target()
    drafter = load_drafter(shipped_drafter_dir(), target)
    prompts = [target.encode_chat(text) for text in soak_prompts(args.prompts)]
    config = SamplingConfig(max_new_tokens=args.max_new_tokens, temperature=0.0)
    # A fixed cost model keeps the scheduler's choices the same from run to run (the demo profiles instead).
    scheduler = PrefixScheduler(SPSTable.linear(0.040, 0.002, 256))
    modes = {}
    with MemorySampler() as plain_memory:
        plain = generate(target, prompts, config, max_batch=args.max_batch, progress=True)
    modes["target only"] = {**plain_memory.summary(), "tokens_per_s": round(plain.tokens_per_second, 2)}
    with MemorySampler() as spec_memory:
        spec = speculative_generate(target, drafter, prompts, config, scheduler=scheduler, max_batch=args.max_batch,
                                    progress=True)
    modes["DSpark + Algorithm 1"] = {**spec_memory.summary(), "tokens_per_s": round(spec.tokens_per_second, 2),
                                     "tau": round(spec.stats.tau, 3)}
    identical = [a == b for a, b in zip(plain.tokens, spec.tokens)]
    path = write_result("soak_cpu", {
        "prompts": len(prompts), "max_new_tokens": args.max_new_tokens, "max_batch": args.max_batch,
        "threads": torch.get_num_threads(), "warm_up_fraction": WARM_UP_FRACTION,
        "identical_outputs": all(identical), "identical_prompts": sum(identical), "modes": modes}, args.out)
    for mode, row in modes.items():
        print(f"{mode}: {row['seconds']} s, RSS {row['rss_mib_start']} -> {row['rss_mib_end']} MiB, slope "
              f"{row['rss_slope_mib_per_min']} MiB/min")
    print(f"identical outputs: {sum(identical)} of {len(prompts)}; wrote {path}")


if __name__ == "__main__":
    main()
