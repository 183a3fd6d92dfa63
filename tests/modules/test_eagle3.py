"""The EAGLE-3-style baseline: its unrolled training pass equals the chain it drafts at decode time."""

import pytest
import torch

from dspark.eagle3 import Eagle3Drafter
from dspark.sampling import warp_logits
from dspark.testing import assert_close, assert_equal, randomize_, tiny_config

GAMMA = 4


def _drafter(seed=0):
    config = tiny_config(num_draft_layers=1, markov_rank=0, enable_confidence_head=False,
                         confidence_head_with_markov=False, block_size=GAMMA)
    return randomize_(Eagle3Drafter(config), seed=seed, std=0.4).double().eval()


def _sequence(drafter, length, seed=0):
    gen = torch.Generator().manual_seed(seed)
    config = drafter.config
    ids = torch.randint(config.vocab_size, (length,), generator=gen)
    taps = torch.randn(length, config.num_taps * config.target_hidden_size, generator=gen, dtype=torch.float64)
    return ids, taps


@pytest.mark.parametrize("length", [GAMMA + 2, 13])
@torch.no_grad()
def test_unrolled_steps_equal_the_teacher_forced_chain(length):
    """TTT step i at position t must be what the chain anchored at t − i computes at its i-th token."""
    drafter = _drafter()
    ids, taps = _sequence(drafter, length)
    unrolled = drafter.ttt_logits(ids, taps, GAMMA)
    for anchor in range(1, length - GAMMA + 1):
        cache = drafter.new_cache(1, capacity=3)
        drafter.extend_cache(cache, taps[None, :anchor], torch.tensor([anchor]), ids[None, :anchor])
        chain = drafter.chain_logits(ids[anchor : anchor + 1], cache,
                                     lambda j, _, a=anchor: ids[a + j + 1 : a + j + 2])
        for j, logits in enumerate(chain):
            # float64 on both sides: only the summation order differs.
            assert_close(logits[0], unrolled[j][anchor + j], rtol=1e-9, atol=1e-10, name=f"anchor {anchor} step {j}")


def _padded(seq, starts, width):
    """Rows ``seq[s : s + width]`` for each start, zero-padded past the end."""
    rows = []
    for s in starts.tolist():
        piece = seq[s : s + width]
        rows.append(torch.cat([piece, seq.new_zeros(width - len(piece), *seq.shape[1:])]))
    return torch.stack(rows)


@torch.no_grad()
def test_ragged_cache_equals_one_request_at_a_time():
    drafter = _drafter(1)
    ids, taps = _sequence(drafter, 11, seed=1)
    cache = drafter.new_cache(2, capacity=2)  # too small on purpose: the cache must grow
    for counts in ([4, 0], [3, 5]):  # ragged, one request empty in the first extend
        n = torch.tensor(counts)
        width = int(n.max())
        drafter.extend_cache(cache, _padded(taps, cache.lengths, width), n, _padded(ids, cache.lengths, width))
    anchors = ids[cache.lengths]
    uniforms = torch.rand(2, GAMMA, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    together = drafter.draft(anchors, cache, uniforms)
    for row in range(2):
        alone = drafter.new_cache(1)
        length = int(cache.lengths[row])
        drafter.extend_cache(alone, taps[None, :length], torch.tensor([length]), ids[None, :length])
        single = drafter.draft(anchors[row : row + 1], alone, uniforms[row : row + 1])
        assert_equal(together.tokens[row], single.tokens[0], name=f"request {row} tokens")
        assert_close(together.draft_probs[row], single.draft_probs[0], rtol=1e-9, atol=1e-12, name="probs")


@pytest.mark.parametrize("temperature", [0.0, 0.8])
@torch.no_grad()
def test_draft_samples_each_step_by_inverse_cdf(temperature):
    drafter = _drafter(2)
    ids, taps = _sequence(drafter, 9, seed=2)
    cache = drafter.new_cache(1)
    drafter.extend_cache(cache, taps[None, :8], torch.tensor([8]), ids[None, :8])
    uniforms = torch.rand(1, GAMMA, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    out = drafter.draft(ids[8:9], cache, uniforms, temperature=temperature, top_k=5)
    chain = drafter.chain_logits(ids[8:9], cache, lambda j, _: out.tokens[:, j])
    for j, logits in enumerate(chain):
        probs = warp_logits(logits, temperature, 5, None)
        assert_close(out.draft_probs[:, j], probs, rtol=1e-12, atol=0, name=f"step {j} probs")
        cdf = probs[0].cumsum(0)
        token = int(out.tokens[0, j])
        assert float(probs[0, token]) > 0
        if temperature == 0:
            assert token == int(logits[0].argmax())
        else:
            lower = float(cdf[token - 1]) if token else 0.0
            assert lower <= float(uniforms[0, j]) * float(cdf[-1]) < float(cdf[token]) + 1e-12


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="one draft layer"):
        Eagle3Drafter(tiny_config(num_draft_layers=2, markov_rank=0, enable_confidence_head=False))
    with pytest.raises(ValueError, match="no Markov or confidence head"):
        Eagle3Drafter(tiny_config(num_draft_layers=1))
    drafter = _drafter()
    cache = drafter.new_cache(1)
    with pytest.raises(ValueError, match="committed tokens"):
        drafter.extend_cache(cache, torch.zeros(1, 2, drafter.fc.in_features, dtype=torch.float64),
                             torch.tensor([2]))


def test_ttt_loss_reads_step_i_at_anchor_plus_i_over_the_answer_prefix():
    drafter = _drafter(3).float()
    ids, taps = _sequence(drafter, 12, seed=3)
    taps = taps.float()
    loss_mask = torch.tensor([False] * 3 + [True] * 6 + [False] + [True] * 2)  # a hole at position 9
    gen = torch.Generator().manual_seed(5)
    target_probs = torch.softmax(torch.randn(12, drafter.config.vocab_size, generator=gen), -1)
    anchors = torch.tensor([3, 6, 10])
    out = drafter.ttt_loss(ids, taps, target_probs, loss_mask, anchors, normalizer=3.0)
    # Supervised while x_{a+i+1} is an answer token, stopping at the hole (position 9) and the end (11).
    want_mask = torch.tensor([[True] * 4, [True, True, False, False], [True, False, False, False]])
    assert_equal(out.mask, want_mask, name="mask")
    with torch.no_grad():
        logits = drafter.ttt_logits(ids, taps, GAMMA)
    soft_ce = 0.0
    for n, a in enumerate(anchors.tolist()):
        for i in range(GAMMA):
            if not want_mask[n, i]:
                continue
            log_q = torch.log_softmax(logits[i][a + i], -1)
            soft_ce += 0.8**i * float(-(target_probs[a + i] * log_q).sum())
            c = 1 - 0.5 * float((log_q.exp() - target_probs[a + i]).abs().sum())
            assert abs(float(out.acceptance[n, i]) - c) < 1e-5
    # fp32 log-softmax over 37 entries: 1e-5 relative covers the summation order.
    assert abs(float(out.loss.detach()) - soft_ce / 3.0) <= 1e-5 * soft_ce
    lean = drafter.ttt_loss(ids, taps, target_probs, loss_mask, anchors, normalizer=3.0, metrics=False)
    assert lean.acceptance is None and lean.hits is None
    assert float(lean.loss.detach()) == float(out.loss.detach()) and bool((lean.ce_sums == out.ce_sums).all())
    with pytest.raises(ValueError, match="anchors"):
        drafter.ttt_loss(ids, taps, target_probs, loss_mask, torch.tensor([0]), normalizer=1.0)
