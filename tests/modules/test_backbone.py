import pytest
import torch
from dspark.reference.backbone import draft_forward
from hypothesis import given
from hypothesis import strategies as st

from dspark import BlockBackbone, DSparkDrafter
from dspark.testing import assert_close, assert_close_float64, randomize_, tiny_config


def make_backbone(seed=0, dtype=torch.float64, **overrides):
    config = tiny_config(**overrides)
    return randomize_(BlockBackbone(config), seed).to(dtype), config


def feature_inputs(config, batch, seq, blocks, seed, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    features = torch.randn(batch, seq, config.num_taps * config.target_hidden_size, generator=gen, dtype=dtype)
    anchor_ids = torch.randint(0, config.vocab_size, (batch, blocks), generator=gen)
    anchor_pos = torch.randint(0, seq + 1, (batch, blocks), generator=gen)
    return features, anchor_ids, anchor_pos


@given(
    qk_norm=st.booleans(),
    block_size=st.integers(1, 4),
    kv_heads=st.sampled_from([1, 2, 4]),
    seq=st.integers(0, 7),
    blocks=st.integers(1, 3),
    seed=st.integers(0, 2**20),
)
def test_training_forward_matches_reference(qk_norm, block_size, kv_heads, seq, blocks, seed):
    model, config = make_backbone(seed, qk_norm=qk_norm, block_size=block_size, num_key_value_heads=kv_heads)
    features, anchor_ids, anchor_pos = feature_inputs(config, 2, seq, blocks, seed)
    valid = torch.rand(2, blocks, generator=torch.Generator().manual_seed(seed)) < 0.8
    with torch.no_grad():
        h = model(anchor_ids, anchor_pos, features, valid)
    want = draft_forward(model.state_dict(), config, anchor_ids, anchor_pos, features, valid)
    assert_close_float64(h[valid], want[valid], name="hidden states of valid blocks")


@given(seed=st.integers(0, 2**20), blocks=st.integers(2, 4))
def test_block_never_sees_context_at_or_after_its_anchor_nor_other_blocks(seed, blocks):
    model, config = make_backbone(seed)
    seq = 8
    features, anchor_ids, anchor_pos = feature_inputs(config, 1, seq, blocks, seed)
    with torch.no_grad():
        base = model(anchor_ids, anchor_pos, features)
        for n in range(blocks):
            a = int(anchor_pos[0, n])
            later = features.clone()
            later[:, a:] = torch.randn_like(later[:, a:]) * 3
            assert torch.equal(model(anchor_ids, anchor_pos, later)[0, n], base[0, n]), (
                f"block {n} changed when context rows >= its anchor {a} changed"
            )
            others = anchor_ids.clone()
            others[0, torch.arange(blocks) != n] = (others[0, torch.arange(blocks) != n] + 1) % config.vocab_size
            moved = anchor_pos.clone()
            moved[0, torch.arange(blocks) != n] = seq - moved[0, torch.arange(blocks) != n]
            assert torch.equal(model(others, moved, features)[0, n], base[0, n]), (
                f"block {n} changed when other blocks' tokens or positions changed"
            )
            if a > 0:
                earlier = features.clone()
                earlier[:, a - 1] += 1
                assert not torch.allclose(model(anchor_ids, anchor_pos, earlier)[0, n], base[0, n]), (
                    f"block {n} ignores the context row just before its anchor"
                )


def test_cache_equals_full_recomputation_over_rounds():
    """Append ragged rows, draft, crop, append again: every round equals the training-layout pass."""
    model, config = make_backbone(3)
    batch, seq = 3, 12
    gen = torch.Generator().manual_seed(4)
    features = torch.randn(batch, seq, config.num_taps * config.hidden_size, generator=gen, dtype=torch.float64)
    tokens = torch.randint(0, config.vocab_size, (batch, seq + 1), generator=gen)
    cache = model.new_cache(batch, capacity=2, dtype=torch.float64)
    lengths = torch.zeros(batch, dtype=torch.long)
    schedule = [[1, 0, 3], [4, 2, 0], [0, 5, 2], [2, 1, 4]]
    for round_index, num_new in enumerate(schedule):
        num_new = torch.tensor(num_new)
        chunk = torch.stack([torch.nn.functional.pad(features[b, lengths[b]:lengths[b] + num_new[b]],
                                                     (0, 0, 0, int(num_new.max() - num_new[b]))) for b in range(batch)])
        model.extend_cache(cache, chunk, num_new)
        lengths = lengths + num_new
        assert torch.equal(cache.lengths, lengths)
        anchors = tokens[torch.arange(batch), lengths]
        with torch.no_grad():
            cached = model.forward_cached(anchors, cache)
            full = model(anchors[:, None], lengths[:, None], features)[:, 0]
        assert_close_float64(cached, full, name=f"round {round_index}")
        if round_index == 1:
            lengths = lengths - torch.tensor([1, 0, 2])
            cache.crop(lengths)


def test_a_static_cache_drafts_what_a_growing_one_does_and_never_moves_its_memory():
    """Requests join, grow, leave and join again: a static cache read at its full capacity drafts what a growing
    cache read to its longest request drafts, and its storage keeps the addresses it was allocated at."""
    model, config = make_backbone(6)
    gen = torch.Generator().manual_seed(7)
    width = config.num_taps * config.hidden_size
    static = model.new_static_cache(4, 16, dtype=torch.float64)
    addresses = [t.data_ptr() for t in (*static.key_storage, *static.value_storage)]
    growing = None
    for joining, grow, keep in ((2, [3, 5], [0, 1]), (2, [1, 0, 2, 4], [3, 0, 2]), (1, [6, 1, 2, 1], [1, 2])):
        part = model.new_cache(joining, capacity=2, dtype=torch.float64)
        model.extend_cache(part, torch.randn(joining, 4, width, generator=gen, dtype=torch.float64),
                           torch.randint(1, 5, (joining,), generator=gen))
        static.merge(part)
        if growing is None:
            growing = model.new_cache(joining, capacity=2, dtype=torch.float64)
            growing.keys, growing.values = [k.clone() for k in part.keys], [v.clone() for v in part.values]
            growing.lengths, growing.host_lengths = part.lengths.clone(), part.host_lengths.clone()
        else:
            growing.merge(part)
        chunk = torch.randn(len(grow), 6, width, generator=gen, dtype=torch.float64)
        for cache in (static, growing):
            model.extend_cache(cache, chunk, torch.tensor(grow))
        anchors = torch.randint(0, config.vocab_size, (len(grow),), generator=gen)
        with torch.no_grad():
            full_capacity = model.forward_cached(anchors, static, context_rows=static.capacity)
            longest = model.forward_cached(anchors, growing)
        assert_close_float64(full_capacity, longest, name="static against growing cache")
        assert torch.equal(static.lengths, growing.lengths)
        for cache in (static, growing):
            cache.select(torch.tensor(keep))
    assert [t.data_ptr() for t in (*static.key_storage, *static.value_storage)] == addresses


def test_a_static_cache_refuses_more_requests_or_positions_than_it_holds():
    model, config = make_backbone(8)
    width = config.num_taps * config.hidden_size
    static = model.new_static_cache(2, 6, dtype=torch.float64)
    part = model.new_cache(2, dtype=torch.float64)
    model.extend_cache(part, torch.zeros(2, 4, width, dtype=torch.float64), torch.tensor([4, 2]))
    static.merge(part)
    with pytest.raises(ValueError, match="holds 2 requests"):
        static.merge(model.new_cache(1, dtype=torch.float64))
    with pytest.raises(ValueError, match="holds 6 positions"):
        model.extend_cache(static, torch.zeros(2, 3, width, dtype=torch.float64), torch.tensor([3, 0]))
    static.select(torch.tensor([1]))
    long = model.new_cache(1, dtype=torch.float64)
    model.extend_cache(long, torch.zeros(1, 7, width, dtype=torch.float64), torch.tensor([7]))
    with pytest.raises(ValueError, match="holds 6 positions"):
        static.merge(long)
    with pytest.raises(ValueError, match="max_batch and capacity"):
        model.new_static_cache(0, 6)


def test_padding_block_changes_nothing_in_valid_blocks():
    model, config = make_backbone(5)
    features, anchor_ids, anchor_pos = feature_inputs(config, 1, 6, 3, 5)
    valid = torch.tensor([[True, False, True]])
    with torch.no_grad():
        a = model(anchor_ids, anchor_pos, features, valid)
        anchor_ids[0, 1] = (anchor_ids[0, 1] + 3) % config.vocab_size
        b = model(anchor_ids, anchor_pos, features, valid)
    assert torch.equal(a[valid], b[valid])


def test_dropout_acts_in_training_mode_only():
    """Eval mode ignores ``dropout``; training mode with 0 equals eval mode; with p > 0 it drops, and the drops
    come from the global generator (same seed, same output)."""
    model, config = make_backbone(4)
    features, anchor_ids, anchor_pos = feature_inputs(config, 2, 7, 3, 4)
    with torch.no_grad():
        model.eval()
        plain = model(anchor_ids, anchor_pos, features)
        assert torch.equal(model(anchor_ids, anchor_pos, features, dropout=0.5), plain)
        model.train()
        assert torch.equal(model(anchor_ids, anchor_pos, features), plain)
        torch.manual_seed(1)
        dropped = model(anchor_ids, anchor_pos, features, dropout=0.5)
        torch.manual_seed(1)
        assert torch.equal(model(anchor_ids, anchor_pos, features, dropout=0.5), dropped)
    assert not torch.allclose(dropped, plain)


def test_float32_forward_close_to_float64_reference():
    model64, config = make_backbone(7)
    model32 = BlockBackbone(config)
    model32.load_state_dict({k: v.float() for k, v in model64.state_dict().items()})
    features, anchor_ids, anchor_pos = feature_inputs(config, 1, 6, 2, 7)
    with torch.no_grad():
        h32 = model32(anchor_ids, anchor_pos, features.float())
    want = draft_forward(model64.state_dict(), config, anchor_ids, anchor_pos, features)
    # Two layers of O(1) activations in fp32 (eps 1.2e-7) through d=12 reductions and norms: ~1e-6.
    assert_close(h32, want, rtol=2e-5, atol=2e-5, name="fp32 hidden")


def test_growing_keeps_the_drafter_s_outputs_and_trains_the_new_layers():
    """A drafter grown by layers drafts exactly what it drafted before, in training and cached layouts, and the
    zeroed output projections of the new layers receive gradients, so training can bring the new layers in."""
    config = tiny_config(num_draft_layers=1, markov_head_type="gated", confidence_head_with_markov=True)
    model = randomize_(DSparkDrafter(config), 11).double()
    features, anchor_ids, anchor_pos = feature_inputs(config, 2, 6, 3, 11)
    next_ids = torch.randint(0, config.vocab_size, (2, 3, config.block_size - 1),
                             generator=torch.Generator().manual_seed(12))
    cache = model.new_cache(2, dtype=torch.float64)
    model.extend_cache(cache, features, torch.tensor([6, 4]))
    with torch.no_grad():
        before = model.training_logits(anchor_ids, anchor_pos, features, next_ids)
        cached_before = model.forward_cached(anchor_ids[:, 0], cache)
    sibling = DSparkDrafter(config)
    model.grow(3)
    assert model.config.num_draft_layers == 3 and len(model.layers) == 3
    assert sibling.config.num_draft_layers == 1, "growing one drafter changed the config another one shares"
    cache = model.new_cache(2, dtype=torch.float64)
    model.extend_cache(cache, features, torch.tensor([6, 4]))
    after = model.training_logits(anchor_ids, anchor_pos, features, next_ids)
    with torch.no_grad():
        assert torch.equal(model.forward_cached(anchor_ids[:, 0], cache), cached_before)
    assert torch.equal(after[0].detach(), before[0]) and torch.equal(after[1].detach(), before[1])
    after[0].square().mean().backward()
    for name in ("layers.1.self_attn.o_proj.weight", "layers.2.mlp.down_proj.weight"):
        grad = dict(model.named_parameters())[name].grad
        assert grad is not None and bool(grad.abs().gt(0).any()), f"{name} gets no gradient"
    with pytest.raises(ValueError, match="cannot grow to 2"):
        model.grow(2)


def test_speculators_parameter_names():
    model = DSparkDrafter(tiny_config(markov_head_type="rnn"))
    names = set(model.state_dict())
    for expected in ["fc.weight", "hidden_norm.weight", "norm.weight", "lm_head.weight", "embed_tokens.weight",
                     "layers.0.self_attn.q_proj.weight", "layers.1.self_attn.k_norm.weight",
                     "layers.0.mlp.down_proj.weight", "layers.0.input_layernorm.weight",
                     "markov_head.markov_w1.weight", "markov_head.markov_w2.weight", "markov_head.joint_proj.bias",
                     "confidence_head.proj.weight", "confidence_head.proj.bias"]:
        assert expected in names, expected
    assert not model.embed_tokens.weight.requires_grad and not model.lm_head.weight.requires_grad


@pytest.mark.parametrize("draft_vocab_size", [None, 11], ids=["full vocabulary", "reduced vocabulary"])
def test_drafter_training_logits_align_with_inference_draft(draft_vocab_size):
    """Teacher-forced logits at the drafted tokens equal the distributions the inference path samples; with a
    reduced vocabulary, over the draft ids mapped into the target vocabulary, and the confidence head reads the
    drafted tokens as target ids."""
    config = tiny_config(markov_head_type="gated", confidence_head_with_markov=True,
                         draft_vocab_size=draft_vocab_size)
    model = randomize_(DSparkDrafter(config), 9).double()
    if draft_vocab_size is not None:
        ids = torch.randperm(config.vocab_size, generator=torch.Generator().manual_seed(3))[:draft_vocab_size]
        model.set_draft_vocab(ids.sort().values)
    batch, seq = 2, 7
    gen = torch.Generator().manual_seed(10)
    features = torch.randn(batch, seq, config.num_taps * config.hidden_size, generator=gen, dtype=torch.float64)
    anchors = torch.randint(0, config.vocab_size, (batch,), generator=gen)
    cache = model.new_cache(batch, dtype=torch.float64)
    model.extend_cache(cache, features, torch.full((batch,), seq))
    out = model.draft(anchors, cache, torch.rand(batch, config.block_size, generator=gen, dtype=torch.float64))
    logits, conf = model.training_logits(anchors[:, None], torch.full((batch, 1), seq), features,
                                         out.tokens[:, None, :-1])
    probs = torch.softmax(logits[:, 0], -1).detach()
    if draft_vocab_size is not None:
        assert bool(torch.isin(out.tokens, model.draft_to_target).all())
        full = torch.zeros(batch, config.block_size, config.vocab_size, dtype=probs.dtype)
        probs = full.index_copy_(-1, model.draft_to_target, probs)
    assert_close_float64(out.draft_probs, probs, name="draft probs")
    assert_close_float64(out.confidence_logits, conf[:, 0].detach(), name="confidence logits")
    assert_close_float64(out.survival, torch.sigmoid(conf[:, 0]).cumprod(-1).detach(), name="survival")


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda m, f: m(torch.zeros(1, 2, dtype=torch.long), torch.tensor([[0, 9]]), f), "anchor_pos must lie"),
        (lambda m, f: m(torch.full((1, 2), 40), torch.zeros(1, 2, dtype=torch.long), f), "anchor_ids"),
        (lambda m, f: m(torch.zeros(1, 2, dtype=torch.long), torch.zeros(1, 2, dtype=torch.long), f[..., :-1]),
         "taps"),
        (lambda m, f: m.extend_cache(m.new_cache(1), f.float(), torch.tensor([7])), "num_new"),
        (lambda m, f: m(torch.zeros(1, 2, dtype=torch.long), torch.zeros(1, 2, dtype=torch.long), f, dropout=1.0),
         "dropout"),
    ],
)
def test_bad_backbone_input_raises(call, message):
    model, config = make_backbone(0)
    features = torch.zeros(1, 6, config.num_taps * config.hidden_size, dtype=torch.float64)
    with pytest.raises(ValueError, match=message):
        call(model, features)
