"""Exact inverse-CDF boundaries: every tier of every sampler draws the same token (the fixed-point rule of
``dspark.sampling``), pinned to the index the rule defines."""

from unittest import mock

import dspark.kernels.markov as markov_kernel
import pytest
import torch

from dspark.markov import sample_block
from dspark.testing import assert_equal, random_markov_weights
from dspark.verify import verify
from tests.kernels.conftest import DEVICE

BACKENDS = ("reference", "torch", "triton")
VOCAB = 1000


def _on(backend, tensor):
    return tensor if backend == "reference" else tensor.to(DEVICE)


@pytest.mark.parametrize("fused", [True, False], ids=["one-launch-slots", "four-launch-slots"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("head, top_p, u, expected", [
    ("none", None, 0.25, 250), ("vanilla", None, 0.25, 250), ("none", None, 0.5, 500), ("vanilla", None, 0.5, 500),
    # top-p keeps the whole flat row (no token is strictly more probable than another); one head suffices,
    # as the search runs after the bias, and the interpreter runs its passes slowly.
    ("none", 0.5, 0.75, 750),
])
def test_markov_sampler_ties_on_flat_logits(dtype, head, top_p, u, expected, fused):
    """Flat logits over V = 1000 (a Markov head with W2 = 0 keeps them flat): u · total is a cumulative mass. The
    Triton sampler's two paths (one launch per slot for small batches, four otherwise) both draw it."""
    weights = None
    if head == "vanilla":
        weights = random_markov_weights("vanilla", VOCAB, VOCAB, 4, 3, seed=0)
        weights = weights._replace(w1=weights.w1.to(dtype), w2=torch.zeros(VOCAB, 4, dtype=dtype))
    base = torch.zeros(1, 2, VOCAB, dtype=dtype)
    uniforms = torch.full((1, 2), u, dtype=dtype)
    anchors = torch.tensor([3])
    for backend in BACKENDS:
        w = None if weights is None else weights._replace(w1=_on(backend, weights.w1), w2=_on(backend, weights.w2))
        with mock.patch.object(markov_kernel, "FUSED_MAX_REQUESTS", 64 if fused else 0):
            tokens, _ = sample_block(_on(backend, base), _on(backend, torch.zeros(1, 2, 3, dtype=dtype)),
                                     _on(backend, anchors), _on(backend, uniforms), w, temperature=1.0, top_p=top_p,
                                     backend=backend)
        assert_equal(tokens.cpu(), torch.full((1, 2), expected), name=f"{backend} tokens")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rejection_sampler_ties_in_bonus_and_residual_draws(dtype):
    """Request 0 sends nothing (bonus from a flat p_0, u = 0.5 → 500); request 1's draft is one-hot on token 0,
    rejected, so the residual is flat over tokens 1…1000 (V = 1001, u = 0.5 → 501)."""
    vocab = VOCAB + 1
    flat = torch.full((vocab,), 1 / vocab, dtype=dtype)
    draft = torch.zeros(2, 1, vocab, dtype=dtype)
    draft[:, 0, 0] = 1
    target = flat.expand(2, 2, vocab).clone()
    tokens = torch.zeros(2, 1, dtype=torch.long)
    verify_len = torch.tensor([0, 1])
    accept = torch.full((2, 1), 0.5, dtype=dtype)
    final = torch.full((2,), 0.5, dtype=dtype)
    for backend in BACKENDS:
        out = verify(_on(backend, tokens), _on(backend, draft), _on(backend, target), _on(backend, verify_len),
                     _on(backend, accept), _on(backend, final), backend=backend)
        assert_equal(out.next_token.cpu(), torch.tensor([500, 501]), name=f"{backend} next_token")
        assert_equal(out.num_accepted.cpu(), torch.tensor([0, 0]), name=f"{backend} num_accepted")
