"""Soak: continuous-batching decoding of hundreds of prompts, plain and speculative, with memory sampled through
the run.

Writes ``soak_cpu.json`` (``soak_cpu_tuned.json`` with ``--allocator tuned``): prompts, whether every prompt's
speculative output equals its plain one (greedy), and per mode two memory series with their least-squares slopes
over the run after its first tenth (warm-up: caches and allocator pools fill) and their growth: the resident set
(what the system sees) and the bytes glibc's malloc has handed out and not had back (``mallinfo2``: what live
objects hold). A decoder that leaks (caches of finished requests kept, statistics tensors growing) grows both;
an allocator that keeps freed memory, or fragments it, grows the first alone.

``--allocator default`` decodes with glibc's own settings, as the demo and the decoding API do;
``--allocator tuned`` with :func:`dspark.runtime.machine.tune_cpu_allocator`'s (no mmap, trim threshold 2 GiB),
as ``python -m dspark train`` and ``answer`` do, whose corpus phase decodes too.

    python benchmarks/bench_soak.py [--allocator default|tuned] [--prompts 500] [--max-new-tokens 32]
                                    [--max-batch 8] [--out benchmarks/results]
"""

import argparse
import ctypes
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


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                     "fsmblks", "uordblks", "fordblks", "keepcost")]


def heap_in_use_mib() -> float | None:
    """Bytes glibc's malloc has handed out and not had back, over all arenas and mmapped blocks (``mallinfo2``,
    glibc 2.33 or later); ``None`` elsewhere."""
    try:
        mallinfo2 = ctypes.CDLL("libc.so.6").mallinfo2
    except (OSError, AttributeError):
        return None
    mallinfo2.restype = _Mallinfo2
    info = mallinfo2()
    return (info.uordblks + info.hblkhd) / 2**20


def _slope_per_min(t: np.ndarray, values: np.ndarray) -> float:
    return 60 * float(np.polyfit(t, values, 1)[0]) if len(t) >= 3 else float("nan")


class MemorySampler:
    """Samples resident memory and malloc's bytes in use every ``interval`` seconds on a thread while a ``with``
    block runs."""

    def __init__(self, interval: float = 0.5):
        self.interval, self.samples, self._stop = interval, [], threading.Event()

    def __enter__(self):
        self.start = time.perf_counter()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self):
        while not self._stop.is_set():
            self.samples.append((time.perf_counter() - self.start, resident_mib(), heap_in_use_mib()))
            self._stop.wait(self.interval)

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def summary(self) -> dict:
        t = np.array([s[0] for s in self.samples])
        kept = t >= WARM_UP_FRACTION * t[-1]
        out = {"seconds": round(float(t[-1]), 1)}
        series = {"rss": np.array([s[1] for s in self.samples])}
        if self.samples[0][2] is not None:
            series["heap_in_use"] = np.array([s[2] for s in self.samples])
        for name, values in series.items():
            out.update({f"{name}_mib_start": round(float(values[kept][0]), 1),
                        f"{name}_mib_end": round(float(values[-1]), 1),
                        f"{name}_mib_max": round(float(values.max()), 1),
                        f"{name}_slope_mib_per_min": round(_slope_per_min(t[kept], values[kept]), 3),
                        f"{name}_growth_after_warm_up_mib": round(float(values[-1] - values[kept][0]), 1)})
        # Every tenth sample: seconds, then each series in MiB.
        out["samples"] = [[round(float(s[0]), 1), *(round(float(v[i]), 1) for v in series.values())]
                          for i, s in enumerate(self.samples) if i % 10 == 0]
        out["sample_columns"] = ["seconds", *(f"{name}_mib" for name in series)]
        return out


def soak_prompts(count: int) -> list[str]:
    """Every evaluation prompt (math, code, chat: 344), then ShareGPT first turns from the end of the training
    pool's order. What a soak checks (memory, identical outputs) does not depend on whether the drafter saw them."""
    texts = [p.text for domain in DOMAINS for p in load_prompts(domain)]
    return (texts + load_training_prompts()[::-1])[:count]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--allocator", choices=["default", "tuned"], default="default",
                        help="glibc's own settings, or tune_cpu_allocator's (what training and answering use)")
    parser.add_argument("--prompts", type=int, default=500)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--max-batch", type=int, default=8)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if args.prompts < 1:
        parser.error("--prompts must be positive")
    if args.allocator == "tuned" and not tune_cpu_allocator():
        parser.error("--allocator tuned needs Linux with glibc")
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
    path = write_result("soak_cpu" if args.allocator == "default" else f"soak_cpu_{args.allocator}", {
        "allocator": args.allocator, "prompts": len(prompts), "max_new_tokens": args.max_new_tokens,
        "max_batch": args.max_batch, "threads": torch.get_num_threads(), "warm_up_fraction": WARM_UP_FRACTION,
        "identical_outputs": all(identical), "identical_prompts": sum(identical), "modes": modes}, args.out)
    for mode, row in modes.items():
        heap = (f"; malloc in use {row['heap_in_use_mib_start']} -> {row['heap_in_use_mib_end']} MiB, slope "
                f"{row['heap_in_use_slope_mib_per_min']} MiB/min") if "heap_in_use_mib_end" in row else ""
        print(f"{mode}: {row['seconds']} s, RSS {row['rss_mib_start']} -> {row['rss_mib_end']} MiB, slope "
              f"{row['rss_slope_mib_per_min']} MiB/min{heap}")
    print(f"identical outputs: {sum(identical)} of {len(prompts)}; wrote {path}")


if __name__ == "__main__":
    main()
