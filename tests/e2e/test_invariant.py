"""Invariant attention: correct attention, each query row independent of its pass, and exact greedy decoding."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import dspark.linear
from dspark.linear import (
    BF16_INVARIANT_ROWS,
    SKINNY_ROWS,
    CallRows,
    bf16_call_rows,
    few_row_layout,
    skinny_layout,
    skinny_min_rows,
    skinny_rows,
)
from dspark.runtime.decoding import SamplingConfig, generate, prefill, speculative_generate
from dspark.runtime.invariant import invariant_attention
from dspark.runtime.profiling import choose_few_row_layout
from dspark.scheduler import FixedLength, PrefixScheduler, SPSTable
from dspark.testing import assert_within_reference_error
from tests.e2e.conftest import drafter_for, tiny_target

# Both few-row layouts a bf16 target may take (dspark.runtime.profiling.choose_few_row_layout).
BF16_LAYOUTS = [(SKINNY_ROWS, "transposed", 1)] + (
    [(SKINNY_ROWS, "packed", 1)] if dspark.linear.packed_layout_available(torch.bfloat16) else [])
LONG_PROMPTS = [[(7 * i + r) % 60 + 1 for i in range(length)] for r, length in enumerate((60, 47, 53))]
# Head dimension 64 over a context of some 60 slots: at these sizes torch 2.13's stock CPU attention already sums a
# pass of 6 queries differently from 6 one-query passes in bf16 (test_the_fixture_tells_stock_attention_apart),
# while the 8-wide heads of tiny_target's defaults happen not to.
WIDE = dict(hidden_size=192, num_attention_heads=3, num_key_value_heads=1, intermediate_size=384,
            num_hidden_layers=3, head_dim=64)


def _wide_bf16_target(architecture="llama", invariant_attention=True):
    return tiny_target(architecture, taps=(1,), dtype=torch.bfloat16, invariant_attention=invariant_attention,
                       **WIDE)


def _inputs(seed, batch, heads, kv_heads, queries, slots, dim, dtype=torch.float32, holes="random"):
    """Random q, k, v and a mask. ``holes``: ``"random"`` masks slots at random on top of causality (each query its
    own, so no query's keys nest in another's); ``"verify"`` masks the same random context slots for every query,
    as rolled-back drafts and padding are, before a causal block; ``"none"`` is causal over every slot."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, queries, dim, generator=gen).to(dtype)
    k = torch.randn(batch, kv_heads, slots, dim, generator=gen).to(dtype)
    v = torch.randn(batch, kv_heads, slots, dim, generator=gen).to(dtype)
    allowed = torch.arange(slots) <= torch.arange(slots - queries, slots)[:, None]
    if holes == "random":
        allowed = allowed & (torch.rand(batch, queries, slots, generator=gen) < 0.7)
    elif holes == "verify":
        allowed = allowed & (torch.rand(batch, 1, slots, generator=gen) < 0.7)
    allowed = allowed.expand(batch, queries, slots).clone()
    allowed[..., 0] = True  # every query keeps at least one slot
    step = torch.arange(queries)
    allowed[:, step, slots - queries + step] = True  # and its own: a query that may not see itself is padding
    return q, k, v, allowed[:, None]


def _float64_attention(q, k, v, allowed, scaling):
    groups = q.shape[1] // k.shape[1]
    k, v = (t.double().repeat_interleave(groups, 1) for t in (k, v))
    scores = (q.double() @ k.transpose(-1, -2)) * scaling
    return torch.softmax(scores.masked_fill(~allowed, float("-inf")), -1) @ v


@settings(max_examples=40, deadline=None)
@given(batch=st.integers(1, 3), kv_heads=st.integers(1, 3), groups=st.integers(1, 3), queries=st.integers(1, 9),
       extra=st.integers(0, 20), dim=st.sampled_from([1, 5, 8, 64]), seed=st.integers(0, 2**31))
def test_invariant_attention_is_attention(batch, kv_heads, groups, queries, extra, dim, seed):
    q, k, v, allowed = _inputs(seed, batch, kv_heads * groups, kv_heads, queries, queries + extra, dim)
    got, weights = invariant_attention(None, q, k, v, allowed, dim ** -0.5)
    assert weights is None and got.shape == (batch, queries, kv_heads * groups, dim)
    exact = _float64_attention(q, k, v, allowed, dim ** -0.5).transpose(1, 2)
    sdpa = torch.nn.functional.scaled_dot_product_attention(
        q, k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1), attn_mask=allowed).transpose(1, 2)
    assert_within_reference_error(got, sdpa, exact, name="invariant attention")


@pytest.mark.parametrize("holes", ["random", "verify", "none"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_each_query_row_equals_that_query_alone_over_its_own_keys(dtype, holes):
    # The three ways keys are taken (an index per query, one gather per request, a slice of the cache) must give
    # what a one-query pass over a cache holding exactly the seen keys gives: a one-token step with no holes.
    q, k, v, allowed = _inputs(5, 3, 6, 2, 7, 19, 16, dtype, holes)
    out, _ = invariant_attention(None, q, k, v, allowed, 0.25)
    for b in range(3):
        for t in range(7):
            seen = allowed[b, 0, t].nonzero().squeeze(1)
            alone, _ = invariant_attention(None, q[b:b + 1, :, t:t + 1], k[b:b + 1, :, seen], v[b:b + 1, :, seen],
                                           None, 0.25)  # no mask: causal over exactly its keys, as in a plain step
            assert torch.equal(out[b, t], alone[0, 0]), (dtype, b, t)


@pytest.mark.parametrize("holes", ["random", "verify"])
def test_padding_queries_come_out_as_zeros_and_leave_the_others_alone(holes):
    # A query that may not see its own slot is padding (a request that sends fewer tokens than the pass is wide):
    # its row is never read, so it is not computed, and the live queries get what they get in a pass without it.
    q, k, v, allowed = _inputs(7, 3, 6, 2, 5, 17, 16, torch.bfloat16, holes)
    padded = allowed.clone()
    padded[0, 0, 3:, 17 - 5 + 3:] = False  # request 0 sends 3 tokens: slots 3 and 4 of the pass are padding
    padded[2, 0, 1:, 17 - 5 + 1:] = False  # request 2 sends 1
    out, _ = invariant_attention(None, q, k, v, padded, 0.25)
    full, _ = invariant_attention(None, q, k, v, allowed, 0.25)
    live = torch.ones(3, 5, dtype=torch.bool)
    live[0, 3:], live[2, 1:] = False, False
    assert torch.equal(out[~live], torch.zeros_like(out[~live]))
    assert torch.equal(out[live], full[live])


def test_no_mask_means_causal_over_every_slot():
    q, k, v, _ = _inputs(6, 2, 4, 4, 5, 9, 8)
    causal = (torch.arange(9) <= torch.arange(4, 9)[:, None]).expand(2, 1, 5, 9)
    assert torch.equal(invariant_attention(None, q, k, v, None, 0.3)[0],
                       invariant_attention(None, q, k, v, causal.clone(), 0.3)[0])


@pytest.mark.parametrize("kwargs, match", [
    ({"sliding_window": 16}, "sliding_window"), ({"softcap": 50.0}, "softcap"), ({"s_aux": torch.ones(4)}, "s_aux"),
    ({"dropout": 0.1}, "dropout")])
def test_invariant_attention_refuses_what_it_does_not_compute(kwargs, match):
    q, k, v, allowed = _inputs(0, 1, 4, 2, 2, 4, 8)
    with pytest.raises(ValueError, match=match):
        invariant_attention(None, q, k, v, allowed, 0.3, **kwargs)
    with pytest.raises(ValueError, match="boolean"):
        invariant_attention(None, q, k, v, allowed.float(), 0.3)
    with pytest.raises(ValueError, match="do not group"):
        invariant_attention(None, q[:, :3], k, v, allowed, 0.3)


@pytest.mark.parametrize("architecture", ["mistral", "gemma3"])
def test_windowed_targets_refuse_invariant_attention(architecture):
    with pytest.raises(ValueError, match="plain causal attention only"):
        tiny_target(architecture, invariant_attention=True)


def _block_logits(target, prompts, chunks):
    """Logits of the six tokens after ``prompts``, fed in passes of ``chunks`` tokens."""
    fed = [[21 + 9 * r + i for i in range(6)] for r in range(len(prompts))]
    state, *_ = prefill(target, prompts)
    out, start = [], 0
    for width in chunks:
        ids = torch.tensor([f[start:start + width] for f in fed])
        positions = state.next_pos[:, None] + torch.arange(width)
        out.append(target.forward(state, ids, positions, torch.ones_like(ids, dtype=torch.bool)).logits)
        state.next_pos += width
        start += width
    return torch.cat(out, 1)


@pytest.mark.parametrize("architecture", ["llama", "qwen3"])
@pytest.mark.parametrize("layout", BF16_LAYOUTS)
def test_a_bf16_verify_pass_gives_each_token_the_logits_of_a_one_token_step(architecture, layout):
    target = _wide_bf16_target(architecture)
    with few_row_layout(*layout):
        for prompts in (LONG_PROMPTS[:1], LONG_PROMPTS):  # one request; three of different lengths (padded prefill)
            one_by_one = _block_logits(target, prompts, [1] * 6)
            for chunks in ([6], [2, 4], [3, 1, 2]):
                assert torch.equal(_block_logits(target, prompts, chunks), one_by_one), (len(prompts), chunks)


@pytest.mark.parametrize("architecture", ["llama", "qwen3"])
def test_the_fixture_tells_stock_attention_apart(architecture):
    # The control for the test above: were stock attention to sum alike in all its cases too, that test could not
    # fail. Which case tells them apart depends on the CPU's bf16 kernels: on an AVX2-only AMD EPYC a single
    # llama request sums alike in one pass and in one-token steps, and three padded requests do not.
    target = _wide_bf16_target(architecture, invariant_attention=False)
    assert any(not torch.equal(_block_logits(target, prompts, [6]), _block_logits(target, prompts, [1] * 6))
               for prompts in (LONG_PROMPTS[:1], LONG_PROMPTS))


@pytest.mark.parametrize("layout", BF16_LAYOUTS)
def test_bf16_greedy_speculative_decoding_equals_greedy_decoding(layout):
    target = _wide_bf16_target()
    drafter = drafter_for(target).to(torch.bfloat16)
    config = SamplingConfig(max_new_tokens=24, temperature=0.0)
    sps = SPSTable.linear(1.0, 0.05, 64)
    with few_row_layout(*layout):
        plain = generate(target, LONG_PROMPTS, config).tokens
        for policy in (FixedLength(4), FixedLength(1), PrefixScheduler(sps)):
            assert speculative_generate(target, drafter, LONG_PROMPTS, config, scheduler=policy).tokens == plain
            single = [speculative_generate(target, drafter, [p], config, scheduler=policy).tokens[0]
                      for p in LONG_PROMPTS]
            assert single == plain, f"{policy.name}, batch 1"


@pytest.mark.parametrize("layout", BF16_LAYOUTS)
def test_bf16_continuous_batching_gives_each_request_its_tokens_alone(layout):
    # Requests join one by one as others finish, at other rounds in each decoder: exact only because every
    # request is prefilled alone and every later pass computes each row as it would alone.
    target = _wide_bf16_target()
    drafter = drafter_for(target).to(torch.bfloat16)
    prompts = LONG_PROMPTS + [p[:29] for p in LONG_PROMPTS[:2]]
    with few_row_layout(*layout):
        greedy = SamplingConfig(max_new_tokens=16, temperature=0.0)
        eos = generate(target, prompts[:1], greedy).tokens[0][6]
        config = SamplingConfig(max_new_tokens=16, temperature=0.0, eos_token_id=eos)
        alone = [generate(target, [p], config).tokens[0] for p in prompts]
        assert len({len(t) for t in alone}) > 1, "the EOS must end some requests early"
        assert generate(target, prompts, config, max_batch=2).tokens == alone
        for policy in (FixedLength(4), PrefixScheduler(SPSTable.linear(1.0, 0.05, 64))):
            spec = speculative_generate(target, drafter, prompts, config, scheduler=policy, max_batch=2)
            assert spec.tokens == alone, policy.name


def test_a_bf16_target_chooses_among_row_invariant_layouts():
    target = tiny_target(dtype=torch.bfloat16, invariant_attention=True)
    with few_row_layout(SKINNY_ROWS):
        choose_few_row_layout(target, 3, requests=1, context=5, repeats=1)
        assert (skinny_rows(), skinny_layout(), skinny_min_rows()) in BF16_LAYOUTS


@pytest.mark.parametrize("single_rows_apart", [False, True], ids=["mixing from 2 rows", "single rows apart"])
def test_a_product_that_rounds_rows_apart_is_cut_into_calls_that_do_not(single_rows_apart, monkeypatch):
    # oneDNN keeps rows apart for most shapes, not all, and which ones depends on the CPU; a kernel that rounds the
    # rows of one of the target's shapes by the call's row count must still leave verify passes equal to one-token
    # steps. Either every call of more than one row rounds apart (calls of one row are left), or single rows round
    # apart from calls of more, as oneDNN's (576, 1536) product does on an AMD EPYC (single rows are padded to two).
    import torch.nn.functional as F

    real = F.linear

    def uneven(x, weight, bias=None):  # multiplies rows one by one, then rounds some calls of one shape apart
        flat = x.reshape(-1, x.shape[-1])  # leading dims are rows, as for F.linear
        out = torch.cat([real(row, weight, bias) for row in flat.split(1)])
        if weight.shape == (384, 192):
            if single_rows_apart:
                out = out * 1.01 if len(flat) == 1 else out
            else:
                out = out + 0.01 * (out.sum(0) - out)
        return out.reshape(*x.shape[:-1], -1)

    target = _wide_bf16_target()
    monkeypatch.setattr(F, "linear", uneven)
    dspark.linear._measured_call_rows.cache_clear()
    try:
        with few_row_layout(SKINNY_ROWS, "transposed", 1):
            plan = CallRows(2, BF16_INVARIANT_ROWS) if single_rows_apart else CallRows(1, 1)
            assert bf16_call_rows(384, 192) == plan
            assert bf16_call_rows(192, 384) == CallRows(1, BF16_INVARIANT_ROWS)
            one_by_one = _block_logits(target, LONG_PROMPTS[:1], [1] * 6)
            assert torch.equal(_block_logits(target, LONG_PROMPTS[:1], [6]), one_by_one)
    finally:
        dspark.linear._measured_call_rows.cache_clear()
