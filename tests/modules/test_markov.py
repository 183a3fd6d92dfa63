import pytest
import torch
from dspark.reference import markov as ref
from hypothesis import given
from hypothesis import strategies as st

from dspark.markov import MarkovHead, markov_step, sample_block, teacher_forced_bias
from dspark.testing import assert_close, assert_close_float64, assert_equal, random_markov_weights

HEAD_TYPES = ["vanilla", "gated", "rnn"]


@given(
    head_type=st.sampled_from(HEAD_TYPES),
    blocks=st.integers(1, 3),
    gamma=st.integers(1, 5),
    vocab=st.integers(2, 29),
    rank=st.integers(1, 6),
    hidden=st.integers(1, 7),
    seed=st.integers(0, 2**31),
)
def test_teacher_forced_bias_matches_reference(head_type, blocks, gamma, vocab, rank, hidden, seed):
    weights = random_markov_weights(head_type, vocab, vocab, rank, hidden, seed=seed)
    gen = torch.Generator().manual_seed(seed + 1)
    prev_ids = torch.randint(0, vocab, (blocks, gamma), generator=gen)
    h = torch.randn(blocks, gamma, hidden, generator=gen, dtype=torch.float64)
    assert_close_float64(teacher_forced_bias(weights, prev_ids, h), ref.teacher_forced_bias(weights, prev_ids, h))


@given(
    head_type=st.sampled_from(HEAD_TYPES + ["none"]),
    requests=st.integers(1, 4),
    gamma=st.integers(1, 5),
    vocab=st.integers(2, 31),
    sampling=st.sampled_from([(1.0, None, None), (0.0, None, None), (0.7, 5, None), (1.3, None, 0.8), (0.9, 3, 0.9)]),
    seed=st.integers(0, 2**31),
)
def test_sample_block_matches_reference(head_type, requests, gamma, vocab, sampling, seed):
    temperature, top_k, top_p = sampling
    rank, hidden = 4, 6
    weights = None if head_type == "none" else random_markov_weights(head_type, vocab, vocab, rank, hidden, seed=seed)
    gen = torch.Generator().manual_seed(seed + 1)
    base = torch.randn(requests, gamma, vocab, generator=gen, dtype=torch.float64)
    h = torch.randn(requests, gamma, hidden, generator=gen, dtype=torch.float64)
    anchors = torch.randint(0, vocab, (requests,), generator=gen)
    u = torch.rand(requests, gamma, generator=gen, dtype=torch.float64)
    kwargs = dict(temperature=temperature, top_k=top_k, top_p=top_p)
    tokens, probs = sample_block(base, h, anchors, u, weights, backend="torch", **kwargs)
    ref_tokens, ref_probs = sample_block(base, h, anchors, u, weights, backend="reference", **kwargs)
    assert_equal(tokens, ref_tokens)
    assert_close_float64(probs, ref_probs, name="draft_probs")


def test_float32_module_stays_close_to_float64_reference():
    weights64 = random_markov_weights("rnn", 50, 50, 8, 16, seed=3)
    weights32 = weights64._replace(**{k: getattr(weights64, k).float() for k in
                                      ("w1", "w2", "joint_weight", "joint_bias")})
    gen = torch.Generator().manual_seed(4)
    h = torch.randn(3, 6, 16, generator=gen, dtype=torch.float64)
    prev = torch.randint(0, 50, (3, 6), generator=gen)
    # fp32 rounding of O(10) magnitudes through rank-8 and 3r x (2r+d) products: ~1e-6 relative.
    assert_close(teacher_forced_bias(weights32, prev, h.float()), ref.teacher_forced_bias(weights64, prev, h),
                 rtol=1e-5, atol=1e-5, name="fp32 bias")


@pytest.mark.parametrize("head_type", HEAD_TYPES)
def test_teacher_forcing_alignment(head_type):
    """Slot k's bias reads x_{k-1} (the anchor for slot 1) and, for rnn, the state of earlier slots only."""
    vocab, gamma = 13, 5
    weights = random_markov_weights(head_type, vocab, vocab, 3, 4, seed=11)
    gen = torch.Generator().manual_seed(12)
    prev = torch.randint(0, vocab, (1, gamma), generator=gen)
    h = torch.randn(1, gamma, 4, generator=gen, dtype=torch.float64)
    base_bias = teacher_forced_bias(weights, prev, h)
    for k in range(gamma):
        changed = prev.clone()
        changed[0, k] = (changed[0, k] + 1) % vocab
        moved = (teacher_forced_bias(weights, changed, h) - base_bias).abs().amax(-1)[0] > 1e-12
        expected = [j == k or (head_type == "rnn" and j > k) for j in range(gamma)]
        assert moved.tolist() == expected, f"changing prev token of slot {k} moved slots {moved.tolist()}"
    # Slot 1 of a vanilla head is W2 · W1[anchor].
    if head_type == "vanilla":
        assert_close_float64(base_bias[0, 0], weights.w2 @ weights.w1[prev[0, 0]])


@pytest.mark.parametrize("head_type", HEAD_TYPES)
def test_sampling_uses_the_teacher_forced_distribution_of_its_own_tokens(head_type):
    """Inference and training agree: p_k = softmax(U_k + B(prev = [anchor, x_1..x_{k-1}]))."""
    vocab, gamma = 17, 4
    weights = random_markov_weights(head_type, vocab, vocab, 3, 5, seed=5)
    gen = torch.Generator().manual_seed(6)
    base = torch.randn(2, gamma, vocab, generator=gen, dtype=torch.float64)
    h = torch.randn(2, gamma, 5, generator=gen, dtype=torch.float64)
    anchors = torch.randint(0, vocab, (2,), generator=gen)
    tokens, probs = sample_block(base, h, anchors, torch.rand(2, gamma, generator=gen, dtype=torch.float64), weights)
    prev = torch.cat([anchors[:, None], tokens[:, :-1]], 1)
    assert_close_float64(probs, torch.softmax(base + teacher_forced_bias(weights, prev, h), -1))


def test_markov_head_module_names_and_forward():
    head = MarkovHead(vocab_size=11, draft_vocab_size=7, rank=3, head_type="gated", hidden_size=5)
    names = set(dict(head.named_parameters()))
    assert names == {"markov_w1.weight", "markov_w2.weight", "gate_proj.weight", "gate_proj.bias"}
    bias = head(torch.zeros(2, 4, dtype=torch.long), torch.zeros(2, 4, 5))
    assert bias.shape == (2, 4, 7)
    single, _ = markov_step(head.weights(), torch.zeros(2, dtype=torch.long), torch.zeros(2, 5), None)
    # Same math, GEMMs of 8 rows against 2: fp32 BLAS may block them differently (seen: 1.5e-8 apart on
    # values near 0.14), so a few ulps are allowed, far below any error in the head's logic.
    assert_close(bias[:, 0], single, rtol=1e-6, atol=1e-7)


def _sample_inputs(vocab=9, gamma=3, requests=2):
    return (torch.randn(requests, gamma, vocab), torch.randn(requests, gamma, 4),
            torch.zeros(requests, dtype=torch.long), torch.rand(requests, gamma))


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda a: (a[0][..., :-1], *a[1:]), "vocabulary mismatch"),
        (lambda a: (a[0], a[1], a[2], a[3][:, :-1]), "uniforms"),
        (lambda a: (a[0].masked_fill(a[0] > 1, float("inf")), *a[1:]), "NaN or Inf"),
        (lambda a: (a[0], a[1], a[2] + 100, a[3]), "anchor_ids"),
        (lambda a: (a[0], a[1][:1], a[2], a[3]), "hidden"),
    ],
)
def test_bad_sample_block_input_raises(mutate, message):
    weights = random_markov_weights("vanilla", 9, 9, 2, 4, seed=0, dtype=torch.float32)
    with pytest.raises(ValueError, match=message):
        sample_block(*mutate(_sample_inputs()), weights)


def test_greedy_refuses_a_bias_that_overflows():
    # Finite inputs pass the entry checks; the bias of a slot overflows only once its previous token is known.
    weights = random_markov_weights("vanilla", 9, 9, 2, 4, seed=0, dtype=torch.float32)
    weights = weights._replace(w1=weights.w1.clone().index_fill_(0, torch.tensor([0]), 3e38))
    with pytest.raises(ValueError, match="NaN or Inf"):
        sample_block(*_sample_inputs(), weights, temperature=0.0, backend="torch")


def test_rank_zero_head_is_refused():
    with pytest.raises(ValueError, match="rank >= 1"):
        MarkovHead(10, 10, 0, "vanilla", 4)


@pytest.mark.parametrize("backend", ["reference", "torch"])
def test_an_out_of_range_draft_to_target_map_is_refused(backend):
    weights = random_markov_weights("vanilla", vocab=12, rank=3, hidden=5, draft_vocab=6, seed=0)
    base, hidden = torch.randn(2, 3, 6), torch.randn(2, 3, 5)
    anchors, uniforms = torch.tensor([1, 4]), torch.rand(2, 3)
    with pytest.raises(ValueError, match="draft_to_target"):
        sample_block(base, hidden, anchors, uniforms, weights, draft_to_target=torch.tensor([0, 2, 4, 6, 8, 12]),
                     backend=backend)
