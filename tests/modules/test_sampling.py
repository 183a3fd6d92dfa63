import pytest
import torch
from dspark.reference.sampling import sample_row, warp_row
from hypothesis import given
from hypothesis import strategies as st

from dspark.sampling import sample_from_probs, warp_logits
from dspark.testing import assert_close_float64, assert_equal

sampling_params = st.tuples(
    st.sampled_from([0.0, 0.6, 1.0, 1.7]),
    st.one_of(st.none(), st.integers(1, 12)),
    st.one_of(st.none(), st.floats(0.05, 1.0)),
)


@given(rows=st.integers(1, 4), vocab=st.integers(1, 41), params=sampling_params, seed=st.integers(0, 2**31))
def test_warp_and_sample_match_reference(rows, vocab, params, seed):
    temperature, top_k, top_p = params
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=gen, dtype=torch.float64) * 3
    uniforms = torch.rand(rows, generator=gen, dtype=torch.float64)
    probs = warp_logits(logits, temperature, top_k, top_p)
    tokens = sample_from_probs(probs, uniforms)
    for r in range(rows):
        expected = warp_row(logits[r], temperature, top_k, top_p)
        assert_close_float64(probs[r], expected, name=f"probs row {r}")
        assert int(tokens[r]) == sample_row(expected, float(uniforms[r]))
        assert probs[r, tokens[r]] > 0


def test_ties_at_top_k_and_top_p_boundaries_are_kept_together():
    logits = torch.tensor([[2.0, 1.0, 1.0, 0.0]], dtype=torch.float64)
    kept_k = warp_logits(logits, 1.0, top_k=2) > 0
    assert kept_k.tolist() == [[True, True, True, False]]
    probs = torch.softmax(logits, -1)
    # Keep v iff the mass strictly above v is < top_p: the two tied tokens share the same mass above.
    kept_p = warp_logits(logits, 1.0, top_p=float(probs[0, 0]) + 1e-6) > 0
    assert kept_p.tolist() == [[True, True, True, False]]


def test_greedy_is_first_argmax_one_hot():
    logits = torch.tensor([[0.0, 3.0, 3.0, 1.0]])
    assert warp_logits(logits, 0.0).tolist() == [[0.0, 1.0, 0.0, 0.0]]


def test_inverse_cdf_boundaries_and_rounding_fallback():
    probs = torch.tensor([[0.0, 0.25, 0.0, 0.75, 0.0]], dtype=torch.float64).expand(4, 5)
    uniforms = torch.tensor([0.0, 0.2499, 0.25, 1 - 2**-53], dtype=torch.float64)
    assert_equal(sample_from_probs(probs, uniforms), torch.tensor([1, 1, 3, 3]))


def test_empirical_frequencies_follow_the_distribution():
    torch.manual_seed(0)
    probs = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)
    n = 200_000
    tokens = sample_from_probs(probs.expand(n, 4), torch.rand(n, dtype=torch.float64))
    freq = torch.bincount(tokens, minlength=4).double() / n
    # Binomial standard error is at most 0.5/sqrt(n) = 1.1e-3; 5 sigma.
    assert (freq - probs).abs().max() < 5.6e-3


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: warp_logits(torch.tensor([[0.0, float("nan")]])), "NaN or Inf"),
        (lambda: warp_logits(torch.zeros(1, 3), -1.0), "temperature"),
        (lambda: warp_logits(torch.zeros(1, 3), 1.0, top_k=0), "top_k"),
        (lambda: warp_logits(torch.zeros(1, 3), 1.0, top_p=0.0), "top_p"),
        (lambda: warp_logits(torch.zeros(1, 3, dtype=torch.long)), "floating"),
        (lambda: sample_from_probs(torch.ones(2, 3), torch.rand(3)), "shape"),
        (lambda: sample_from_probs(torch.ones(2, 3), torch.tensor([0.5, 1.0])), "uniform"),
    ],
)
def test_bad_sampling_input_raises(call, message):
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.parametrize("u, expected", [(0.25, 250), (0.5, 500), (0.75, 750)])
def test_draws_on_exact_boundaries_agree_with_the_reference(u, expected):
    """Uniform over V = 1000: u · total lands exactly on a cumulative mass; the first index past it wins."""
    for dtype in (torch.float32, torch.float64):
        probs = warp_logits(torch.zeros(1, 1000, dtype=dtype), 1.0)
        uniforms = torch.tensor([u], dtype=dtype)
        assert int(sample_from_probs(probs, uniforms)[0]) == expected
        assert sample_row(probs[0], u) == expected
    # top-p = 0.5 keeps every token of a flat row (none is strictly more probable than another).
    flat_top_p = warp_logits(torch.zeros(1, 1000), 1.0, top_p=0.5)
    assert int((flat_top_p > 0).sum()) == 1000
    assert int(sample_from_probs(flat_top_p, torch.tensor([u]))[0]) == expected


def test_sample_from_probs_refuses_weights_that_are_not_part_of_a_distribution():
    with pytest.raises(ValueError, match="non-negative"):
        sample_from_probs(torch.tensor([[0.5, -0.1, 0.6]]), torch.tensor([0.5]))
    with pytest.raises(ValueError, match="at most 2"):
        sample_from_probs(torch.full((1, 4), 0.75), torch.tensor([0.5]))
