import torch
from hypothesis import given
from hypothesis import strategies as st

from dspark.confidence import confidence_survival
from dspark.testing import assert_close_float64, assert_within_reference_error
from tests.kernels.conftest import DEVICE


@given(requests=st.integers(1, 4), gamma=st.integers(1, 7), hidden=st.integers(1, 37), rank=st.integers(0, 9),
       with_bias=st.booleans(), with_sts=st.booleans(), seed=st.integers(0, 2**31))
def test_confidence_kernel_matches_reference(requests, gamma, hidden, rank, with_bias, with_sts, seed):
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    h, weight = rand(requests, gamma, hidden), rand(1, hidden + rank) / hidden**0.5
    bias = rand(1) if with_bias else None
    w1 = rand(13, rank) if rank else None
    prev = torch.randint(0, 13, (requests, gamma), generator=gen) if rank else None
    temps = torch.rand(gamma, generator=gen, dtype=torch.float64) + 0.3 if with_sts else None
    oracle = confidence_survival(h, weight, bias, prev, w1, temps, backend="reference")

    def run(dtype, backend):
        cast = [None if t is None else t.to(DEVICE, dtype) for t in (h, weight, bias, w1, temps)]
        return confidence_survival(cast[0], cast[1], cast[2], None if prev is None else prev.to(DEVICE), cast[3],
                                   cast[4], backend=backend)

    for name, got, want in zip(("logits", "confidence", "survival"), run(torch.float64, "triton"), oracle):
        assert_close_float64(got, want, name=name)
    for name, got, base, want in zip(("logits", "confidence", "survival"), run(torch.float32, "triton"),
                                     run(torch.float32, "torch"), oracle):
        assert_within_reference_error(got, base, want, name=f"fp32 {name}")
