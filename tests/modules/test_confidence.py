import pytest
import torch
from dspark.reference import confidence as ref
from hypothesis import given
from hypothesis import strategies as st

from dspark.confidence import ConfidenceHead, confidence_survival, confidence_target
from dspark.testing import assert_close_float64


@given(
    requests=st.integers(1, 4),
    gamma=st.integers(1, 6),
    hidden=st.integers(1, 9),
    rank=st.integers(0, 4),
    with_bias=st.booleans(),
    with_sts=st.booleans(),
    seed=st.integers(0, 2**31),
)
def test_confidence_survival_matches_reference(requests, gamma, hidden, rank, with_bias, with_sts, seed):
    gen = torch.Generator().manual_seed(seed)
    vocab = 11
    h = torch.randn(requests, gamma, hidden, generator=gen, dtype=torch.float64)
    weight = torch.randn(1, hidden + rank, generator=gen, dtype=torch.float64)
    bias = torch.randn(1, generator=gen, dtype=torch.float64) if with_bias else None
    w1 = torch.randn(vocab, rank, generator=gen, dtype=torch.float64) if rank else None
    prev = torch.randint(0, vocab, (requests, gamma), generator=gen) if rank else None
    temps = torch.rand(gamma, generator=gen, dtype=torch.float64) * 2 + 0.25 if with_sts else None
    got = confidence_survival(h, weight, bias, prev, w1, temps, backend="torch")
    want = ref.confidence_survival(h, weight, bias, prev, w1, temps)
    for name, a, b in zip(("logits", "confidence", "survival"), got, want):
        assert_close_float64(a, b, name=name)
    survival = got[2]
    assert bool((survival[:, 1:] <= survival[:, :-1]).all()), "survival must be non-increasing along the block"


@given(rows=st.integers(1, 5), vocab=st.integers(1, 40), seed=st.integers(0, 2**31))
def test_confidence_target_matches_reference_and_min_form(rows, vocab, seed):
    gen = torch.Generator().manual_seed(seed)
    draft = torch.randn(rows, vocab, generator=gen, dtype=torch.float64) * 2
    target = torch.randn(rows, vocab, generator=gen, dtype=torch.float64) * 2
    label = confidence_target(draft, target)
    assert_close_float64(label, ref.confidence_target(draft, target))
    overlap = torch.minimum(torch.softmax(draft, -1), torch.softmax(target, -1)).sum(-1)
    assert_close_float64(label, overlap, name="1 - TV == sum min(p_d, p_t)")


def test_confidence_target_extremes_and_no_gradient():
    logits = torch.randn(3, 8, requires_grad=True)
    label = confidence_target(logits, logits.detach())
    assert torch.allclose(label, torch.ones(3)) and not label.requires_grad
    far = confidence_target(torch.tensor([[50.0, -50.0]]), torch.tensor([[-50.0, 50.0]]))
    assert float(far) < 1e-20


def test_head_reads_hidden_and_markov_embedding_in_that_order():
    head = ConfidenceHead(hidden_size=3, markov_rank=2, bias=False)
    with torch.no_grad():
        head.proj.weight.copy_(torch.tensor([[1.0, 0.0, 0.0, 10.0, 0.0]]))
    with torch.no_grad():
        z = head(torch.tensor([[2.0, 5.0, 5.0]]), torch.tensor([[0.5, 7.0]]))
    assert z.item() == pytest.approx(2.0 + 5.0)
    assert head.proj.bias is None


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(weight=torch.zeros(1, 6)), "prev_ids and markov_w1"),
        (dict(weight=torch.zeros(2, 4)), r"\[1, in_features\]"),
        (dict(weight=torch.zeros(1, 3)), "fewer than hidden size"),
        (dict(weight=torch.zeros(1, 4), temperatures=torch.zeros(3)), "positive"),
        (dict(weight=torch.zeros(1, 4), temperatures=torch.ones(2)), "temperatures"),
        (dict(weight=torch.zeros(1, 4), bias=torch.zeros(2)), "bias"),
    ],
)
def test_bad_confidence_input_raises(kwargs, message):
    with pytest.raises(ValueError, match=message):
        confidence_survival(torch.zeros(2, 3, 4), **kwargs)


def test_nonfinite_logits_in_target_raise():
    with pytest.raises(ValueError, match="NaN or Inf"):
        confidence_target(torch.tensor([[float("nan"), 0.0]]), torch.zeros(1, 2))
    with pytest.raises(ValueError, match="must match"):
        confidence_target(torch.zeros(1, 3), torch.zeros(1, 2))
