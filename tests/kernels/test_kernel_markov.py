from unittest import mock

import dspark.kernels.markov as markov_kernel
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from dspark.markov import sample_block
from dspark.testing import assert_close_float64, assert_equal, assert_within_reference_error, random_markov_weights
from tests.kernels.conftest import DEVICE
from tests.strategies import BOUNDARY_DRAWS, LOGIT_SCALES

SAMPLING = [(1.0, None, None), (0.0, None, None), (0.7, 5, None), (1.3, None, 0.8), (0.9, 3, 0.9), (1.0, 1, None),
            (1.0, None, 0.05)]


def _inputs(head, requests, gamma, vocab, seed, reduced=False, scale=1.0, boundary=False):
    """Random sampler inputs; ``scale`` multiplies the base logits and the bias (0: every logit ties), and
    ``boundary`` draws every uniform from ``BOUNDARY_DRAWS`` (exact inverse-CDF boundaries when flat)."""
    draft_vocab = vocab - 3 if reduced else vocab
    weights = None if head == "none" else random_markov_weights(head, vocab, draft_vocab, 5, 6, seed=seed)
    if weights is not None:
        weights = weights._replace(w2=weights.w2 * scale)
    gen = torch.Generator().manual_seed(seed + 1)
    base = torch.randn(requests, gamma, draft_vocab, generator=gen, dtype=torch.float64) * scale
    hidden = torch.randn(requests, gamma, 6, generator=gen, dtype=torch.float64)
    anchors = torch.randint(0, vocab, (requests,), generator=gen)
    if boundary:
        uniforms = BOUNDARY_DRAWS[torch.randint(0, len(BOUNDARY_DRAWS), (requests, gamma), generator=gen)]
    else:
        uniforms = torch.rand(requests, gamma, generator=gen, dtype=torch.float64)
    d2t = torch.randperm(vocab, generator=gen)[:draft_vocab] if reduced else None
    return base, hidden, anchors, uniforms, weights, d2t


def _to(args, dtype):
    base, hidden, anchors, uniforms, weights, d2t = args
    if weights is not None:
        weights = weights._replace(**{name: value.to(DEVICE, dtype) for name, value in weights._asdict().items()
                                      if isinstance(value, torch.Tensor)})
    return (base.to(DEVICE, dtype), hidden.to(DEVICE, dtype), anchors.to(DEVICE), uniforms.to(DEVICE, dtype), weights,
            None if d2t is None else d2t.to(DEVICE))


def _path(fused: bool):
    """Run the Triton sampler on its one-launch-per-slot path (small batches) or its four-launch path."""
    return mock.patch.object(markov_kernel, "FUSED_MAX_REQUESTS", 64 if fused else 0)


@given(head=st.sampled_from(["vanilla", "none"]), requests=st.integers(1, 3), gamma=st.integers(1, 15),
       vocab=st.integers(4, 37), sampling=st.sampled_from(SAMPLING), reduced=st.booleans(),
       scale=st.sampled_from(sorted(LOGIT_SCALES)), boundary=st.booleans(), fused=st.booleans(),
       seed=st.integers(0, 2**31))
def test_markov_kernel_matches_reference(head, requests, gamma, vocab, sampling, reduced, scale, boundary, fused, seed):
    temperature, top_k, top_p = sampling
    kw = dict(temperature=temperature, top_k=top_k, top_p=top_p)
    args = _inputs(head, requests, gamma, vocab, seed, reduced, LOGIT_SCALES[scale], boundary)
    base, hidden, anchors, uniforms, weights, d2t = args
    want_tokens, want_probs = sample_block(base, hidden, anchors, uniforms, weights, draft_to_target=d2t,
                                           backend="reference", **kw)
    b, h, a, u, w, m = _to(args, torch.float64)
    with _path(fused):
        tokens, probs = sample_block(b, h, a, u, w, draft_to_target=m, backend="triton", **kw)
    assert_equal(tokens, want_tokens)
    assert_close_float64(probs, want_probs, name="draft_probs")
    # fp32: probabilities within 2x of PyTorch's own fp32 error; tokens equal to PyTorch's fp32 draw.
    b, h, a, u, w, m = _to(args, torch.float32)
    with _path(fused):
        tokens32, probs32 = sample_block(b, h, a, u, w, draft_to_target=m, backend="triton", **kw)
    torch_tokens, torch_probs = sample_block(b, h, a, u, w, draft_to_target=m, backend="torch", **kw)
    assert_equal(tokens32, torch_tokens, name="fp32 tokens")
    assert_within_reference_error(probs32, torch_probs, want_probs, name="fp32 draft_probs")


@given(requests=st.integers(1, 3), gamma=st.integers(1, 15), vocab=st.integers(4, 300),
       rank=st.sampled_from([1, 8, 32]), sampling=st.sampled_from(SAMPLING), fused=st.booleans(),
       seed=st.integers(0, 2**31))
def test_markov_kernel_in_bf16_matches_the_pytorch_bf16_path(requests, gamma, vocab, rank, sampling, fused, seed):
    """bf16 inputs: both paths compute in fp32 from the same bf16 values (a product of two bf16 numbers is exact in
    fp32), so tokens are equal and probabilities differ only by the order of fp32 sums: 1e-5 relative, 1e-6
    absolute, against the O(1) differences a wrong bias product gives (it once drew one token in every slot)."""
    temperature, top_k, top_p = sampling
    gen = torch.Generator().manual_seed(seed)
    weights = random_markov_weights("vanilla", vocab, vocab, rank, 6, seed=seed)
    weights = weights._replace(w1=weights.w1.to(DEVICE, torch.bfloat16), w2=weights.w2.to(DEVICE, torch.bfloat16))
    base = torch.randn(requests, gamma, vocab, generator=gen).to(DEVICE, torch.bfloat16)
    hidden = torch.randn(requests, gamma, 6, generator=gen).to(DEVICE, torch.bfloat16)
    anchors = torch.randint(0, vocab, (requests,), generator=gen).to(DEVICE)
    uniforms = torch.rand(requests, gamma, generator=gen).to(DEVICE)
    kw = dict(temperature=temperature, top_k=top_k, top_p=top_p)
    with _path(fused):
        tokens, probs = sample_block(base, hidden, anchors, uniforms, weights, backend="triton", **kw)
    want_tokens, want_probs = sample_block(base, hidden, anchors, uniforms, weights, backend="torch", **kw)
    assert_equal(tokens, want_tokens, name="bf16 tokens")
    torch.testing.assert_close(probs, want_probs, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("head", ["gated", "rnn"])
def test_markov_kernel_refuses_non_vanilla_heads_but_auto_falls_back(head, monkeypatch):
    args = _to(_inputs(head, 2, 3, 9, 0), torch.float32)
    with pytest.raises(ValueError, match="vanilla"):
        sample_block(*args[:5], backend="triton")
    monkeypatch.setenv("DSPARK_BACKEND", "triton")  # what "auto" resolves to on a GPU
    assert_equal(sample_block(*args[:5], backend="auto")[0], sample_block(*args[:5], backend="torch")[0])
