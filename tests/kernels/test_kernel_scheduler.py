from hypothesis import given
from hypothesis import strategies as st

from dspark.scheduler import allocate_top_k, schedule_greedy
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


def test_scheduler_kernel_with_many_requests():
    """R = 37 spans several tiles of the pairwise ranking; float32 confidences."""
    import torch

    from dspark.scheduler import SPSTable

    gen = torch.Generator().manual_seed(0)
    confidence = torch.rand(37, 7, generator=gen)
    sps = SPSTable.linear(1.0, 0.02, 37 * 8)
    for early_stop in (True, False):
        want = schedule_greedy(confidence, sps, early_stop=early_stop, backend="reference")
        assert_equal(schedule_greedy(confidence.to(DEVICE), sps, early_stop=early_stop, backend="triton"), want)
    assert_equal(allocate_top_k(confidence.to(DEVICE), 60, backend="triton"),
                 allocate_top_k(confidence, 60, backend="reference"))
