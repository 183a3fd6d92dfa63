import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from dspark.scheduler import SPSTable, allocate_top_k, schedule_greedy
from dspark.testing import assert_equal
from tests.kernels.conftest import DEVICE
from tests.strategies import schedule_inputs


@given(inputs=schedule_inputs(ties=True), early_stop=st.booleans(), budget=st.integers(0, 25))
def test_scheduler_kernel_matches_reference(inputs, early_stop, budget):
    confidence, sps, valid_len, kw = inputs
    on_device = confidence.to(DEVICE)
    valid_dev = None if valid_len is None else valid_len.to(DEVICE)
    if kw["base_tokens"] + confidence.shape[0] * (1 + kw["min_len"]) <= sps.max_tokens:
        want = schedule_greedy(confidence, sps, valid_len, early_stop=early_stop, backend="reference", **kw)
        got = schedule_greedy(on_device, sps, valid_dev, early_stop=early_stop, backend="triton", **kw)
        assert_equal(got, want, name="Algorithm 1 verify_len")
    bounds = dict(min_len=kw["min_len"], max_len=kw["max_len"])
    want = allocate_top_k(confidence, budget, valid_len, backend="reference", **bounds)
    assert_equal(allocate_top_k(on_device, budget, valid_dev, backend="triton", **bounds), want, name="top-K")


@pytest.mark.parametrize("requests, gamma, ties", [(37, 7, False), (37, 7, True), (60, 9, True), (33, 16, False)])
def test_scheduler_kernel_at_batch_sizes(requests, gamma, ties):
    """Batches beyond the hypothesis sizes, with non-power-of-two R and γ and float32 confidences.

    The SPS table is flat up to half the slots and then falls (a memory-bound pass turning compute-bound),
    so Algorithm 1 admits many groups before Θ stops rising; with ties, whole groups share one survival.
    Sizes stay small because the interpreter runs the kernel's scans one element at a time; tests/gpu runs
    R = 256.
    """
    gen = torch.Generator().manual_seed(requests * gamma)
    if ties:
        levels = torch.tensor([0.0, 0.5, 0.9, 1.0])
        confidence = levels[torch.randint(0, 4, (requests, gamma), generator=gen)]
    else:
        confidence = torch.rand(requests, gamma, generator=gen)
    capacity = requests * (gamma + 1)
    sps = SPSTable.from_latencies([1, capacity // 2, capacity], [1.0, 1.0, 3.0])
    valid_len = torch.randint(0, gamma + 1, (requests,), generator=gen)
    for early_stop in (True, False):
        want = schedule_greedy(confidence, sps, valid_len, early_stop=early_stop, backend="reference")
        got = schedule_greedy(confidence.to(DEVICE), sps, valid_len.to(DEVICE), early_stop=early_stop,
                              backend="triton")
        assert_equal(got, want, name=f"Algorithm 1 (early_stop={early_stop}) verify_len")
    for budget in (requests, capacity // 3):
        want = allocate_top_k(confidence, budget, valid_len, backend="reference")
        assert_equal(allocate_top_k(confidence.to(DEVICE), budget, valid_len.to(DEVICE), backend="triton"), want,
                     name=f"top-K (budget {budget})")


def test_scheduler_kernel_refuses_a_group_that_leaves_theta_equal():
    """Θ must strictly rise: two requests whose slot-1 survivals tie (one group of 2, survival 1) take Θ from
    2·SPS(2) = 2 to 4·SPS(4) = 2 exactly, so neither Algorithm 1 nor the argmax admits them; a larger SPS(4)
    admits both. Every tier gives the pinned lengths."""
    confidence = torch.ones(2, 1, dtype=torch.float64)
    for sps_at_4, want in ((0.5, [0, 0]), (0.625, [1, 1])):
        sps = SPSTable(torch.tensor([1.0, 1.0, 1.0, 0.75, sps_at_4], dtype=torch.float64))
        for early_stop in (True, False):
            for backend in ("reference", "torch", "triton"):
                on = confidence.to(DEVICE) if backend == "triton" else confidence
                got = schedule_greedy(on, sps, early_stop=early_stop, backend=backend)
                assert_equal(got.cpu(), torch.tensor(want), name=f"{backend} (early_stop={early_stop})")
