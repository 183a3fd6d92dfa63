"""Hypothesis strategies shared by the module tests and the kernel tests (small shapes, odd sizes)."""

import torch
from hypothesis import strategies as st

from dspark.sampling import sample_from_probs, warp_logits
from dspark.scheduler import SPSTable


@st.composite
def attention_inputs(draw, dtype=torch.float64):
    batch, blocks, gamma = draw(st.integers(1, 2)), draw(st.integers(1, 3)), draw(st.integers(1, 4))
    kv_heads, group = draw(st.integers(1, 2)), draw(st.integers(1, 3))
    head_dim, ctx = draw(st.sampled_from([2, 4, 6])), draw(st.integers(0, 9))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))

    def rand(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype)

    return dict(
        q=rand(batch, blocks, gamma, kv_heads * group, head_dim),
        k_ctx=rand(batch, ctx, kv_heads, head_dim),
        v_ctx=rand(batch, ctx, kv_heads, head_dim),
        k_blk=rand(batch, blocks, gamma, kv_heads, head_dim),
        v_blk=rand(batch, blocks, gamma, kv_heads, head_dim),
        ctx_len=torch.randint(0, ctx + 1, (batch, blocks), generator=gen),
        block_valid=torch.rand(batch, blocks, generator=gen) < 0.8,
    )


# Logit scales: "flat" makes every logit equal (exact ties everywhere), "peaked" puts nearly all mass on one
# token, "normal" is in between.
LOGIT_SCALES = {"flat": 0.0, "normal": 1.0, "peaked": 30.0}
# Draws that land exactly on cumulative masses when the weights are equal (1/4, 1/2, 3/4 of the total).
BOUNDARY_DRAWS = torch.tensor([0.25, 0.5, 0.75], dtype=torch.float64)


def logits_like(draw, gen, *shape) -> torch.Tensor:
    """Random logits of a drawn scale (see ``LOGIT_SCALES``)."""
    scale = LOGIT_SCALES[draw(st.sampled_from(sorted(LOGIT_SCALES)))]
    return torch.randn(*shape, generator=gen, dtype=torch.float64) * scale


def uniforms_like(draw, gen, *shape) -> torch.Tensor:
    """Uniform draws, or with a drawn chance only boundary draws (``BOUNDARY_DRAWS``)."""
    if draw(st.booleans()):
        return BOUNDARY_DRAWS[torch.randint(0, len(BOUNDARY_DRAWS), shape, generator=gen)]
    return torch.rand(*shape, generator=gen, dtype=torch.float64)


@st.composite
def verify_inputs(draw):
    requests, gamma, vocab = draw(st.integers(1, 5)), draw(st.integers(1, 15)), draw(st.integers(2, 41))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    top_k = draw(st.one_of(st.none(), st.integers(1, vocab)))
    greedy = draw(st.booleans())
    temperature = 0.0 if greedy else 1.0
    draft_probs = warp_logits(logits_like(draw, gen, requests, gamma, vocab), temperature, top_k)
    target_probs = warp_logits(logits_like(draw, gen, requests, gamma + 1, vocab), temperature, top_k)
    tokens = sample_from_probs(draft_probs, torch.rand(requests, gamma, generator=gen, dtype=torch.float64))
    eos = draw(st.one_of(st.none(), st.integers(0, vocab - 1)))
    return dict(
        draft_tokens=tokens, draft_probs=draft_probs, target_probs=target_probs,
        verify_len=torch.randint(0, gamma + 1, (requests,), generator=gen),
        accept_uniforms=uniforms_like(draw, gen, requests, gamma),
        final_uniforms=uniforms_like(draw, gen, requests),
        eos_token_id=eos,
    )


@st.composite
def schedule_inputs(draw, ties=False):
    requests, gamma = draw(st.integers(1, 6)), draw(st.integers(1, 5))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    if ties:  # few distinct values, duplicated rows: many exactly equal survivals
        levels = torch.tensor([0.0, 0.5, 0.9, 1.0], dtype=torch.float64)
        confidence = levels[torch.randint(0, 4, (requests, gamma), generator=gen)]
        half = requests // 2
        confidence[requests - half:] = confidence[:half].clone()
    else:
        confidence = torch.rand(requests, gamma, generator=gen, dtype=torch.float64)
    valid_len = torch.randint(0, gamma + 1, (requests,), generator=gen) if draw(st.booleans()) else None
    fixed = draw(st.floats(0.2, 2.0))
    per_token = draw(st.floats(0.01, 0.5))
    base = draw(st.integers(0, 3))
    sps = SPSTable.linear(fixed, per_token, base + requests * (gamma + 1) + draw(st.integers(-requests, 2)))
    min_len = draw(st.integers(0, 1))
    max_len = draw(st.one_of(st.none(), st.integers(min_len, gamma)))
    return confidence, sps, valid_len, dict(min_len=min_len, max_len=max_len, base_tokens=base)
