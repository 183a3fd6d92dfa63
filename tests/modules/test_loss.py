"""The PyTorch loss (its hand-written CE/L1 backward) against the loop-by-loop oracle, in float64."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from dspark.loss import dspark_loss
from dspark.testing import assert_close

TRAINABLE = ("hidden", "lm_head", "markov_emb", "markov_w2", "confidence_logits")


def _inputs(rows, dim, vocab, rank, seed, *, tied=False):
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    hidden, lm_head = rand(rows, dim), rand(vocab, dim)
    weights = torch.rand(rows, generator=gen, dtype=torch.float64)
    weights[torch.rand(rows, generator=gen) < 0.2] = 0
    inputs = dict(hidden=hidden, lm_head=lm_head, target_hidden=rand(rows, dim + 1),
                  target_lm_head=rand(vocab, dim + 1), labels=torch.randint(0, vocab, (rows,), generator=gen),
                  weights=weights, markov_emb=rand(rows, rank), markov_w2=rand(vocab, rank),
                  confidence_logits=rand(rows))
    if tied:  # the target's distribution equals the draft's: p − q is exactly 0 everywhere, so sign(p − q) is 0
        inputs.update(target_hidden=hidden.clone(), target_lm_head=lm_head.clone(), markov_emb=None, markov_w2=None)
    return inputs


def _run(inputs, backend, chunk_rows=None):
    leaves = {k: (v.clone().requires_grad_() if k in TRAINABLE and v is not None else v) for k, v in inputs.items()}
    out = dspark_loss(**leaves, backend=backend, chunk_rows=chunk_rows)
    out.loss.backward()
    values = {"loss": out.loss, "ce": out.ce, "l1": out.l1, "bce": out.bce, "acceptance": out.acceptance}
    return values, {k: leaves[k].grad for k in TRAINABLE if leaves[k] is not None}


def _assert_same(inputs, chunk_rows=None):
    want, want_grads = _run(inputs, "reference")
    got, got_grads = _run(inputs, "torch", chunk_rows)
    # float64 throughout: the two differ only in summation order, far below 1e-10 at these sizes.
    for name in want:
        assert_close(got[name], want[name], rtol=1e-10, atol=1e-12, name=name)
    assert got_grads.keys() == want_grads.keys()
    for name in want_grads:
        assert_close(got_grads[name], want_grads[name], rtol=1e-10, atol=1e-12, name=f"grad {name}")


@given(rows=st.integers(1, 9), dim=st.integers(1, 6), vocab=st.integers(2, 37), rank=st.integers(1, 4),
       chunk=st.sampled_from([None, 1, 4]), seed=st.integers(0, 2**31))
def test_torch_loss_values_and_gradients_equal_the_reference(rows, dim, vocab, rank, chunk, seed):
    _assert_same(_inputs(rows, dim, vocab, rank, seed), chunk)


@pytest.mark.parametrize("rows", [1, 5])
def test_torch_loss_at_exact_ties_between_draft_and_target(rows):
    """p = q exactly: L1 is 0 and its subgradient is taken as 0, as autograd's sign(0) = 0 in the oracle."""
    inputs = _inputs(rows, 4, 11, 2, seed=7, tied=True)
    values, _ = _run(inputs, "torch")
    assert float(values["l1"]) == 0.0
    _assert_same(inputs)


def test_torch_loss_on_one_hot_labels_at_the_largest_logit():
    """A label whose logit dominates: CE is tiny but must come from logsumexp − ℓ, not −log p (no underflow)."""
    inputs = _inputs(3, 2, 9, 2, seed=3)
    inputs["lm_head"][inputs["labels"]] *= 0  # the label rows of the head give logit 0 ...
    inputs["markov_w2"][inputs["labels"]] += 40.0  # ... and the Markov bias lifts them far above the rest
    _assert_same(inputs)
