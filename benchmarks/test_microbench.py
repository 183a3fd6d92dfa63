"""pytest-benchmark microbenchmarks of every computation and tier at the bench_kernels shapes.

    python -m pytest benchmarks/test_microbench.py --benchmark-enable --benchmark-json=benchmarks/results/micro.json

On the CPU the tiers are the PyTorch module and the loop reference (small shapes); on a GPU, Triton and
the PyTorch module at paper scale. Not part of the test suite (tests/ holds no timings).
"""

import pytest
import torch

from benchmarks.bench_kernels import cases

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SCALE = "paper" if DEVICE == "cuda" else "small"
REQUESTS = 64 if DEVICE == "cuda" else 4
CASES = [(name, tier, fn) for name, _, tiers in cases(DEVICE, REQUESTS, SCALE) for tier, fn in tiers.items()]


@pytest.mark.parametrize("name, tier, fn", CASES, ids=[f"{n}-{t}" for n, t, _ in CASES])
def test_microbenchmark(benchmark, name, tier, fn):
    benchmark.group = name
    benchmark.extra_info.update(op=name, tier=tier, device=DEVICE, scale=SCALE, requests=REQUESTS)
    if DEVICE == "cuda":
        benchmark(lambda: (fn(), torch.cuda.synchronize()))
    else:
        benchmark(fn)
