"""Fused Markov block sampler, parallel over the vocabulary: base logits + low-rank bias, temperature,
top-k, top-p and the inverse-CDF draw.

Mirrors ``dspark.reference.markov.sample_block`` for vanilla Markov heads (and for no head, the DFlash
baseline). Slot k's bias reads the token drawn at slot k−1, so the γ slots run in order; within a slot
the work is spread over a grid of (vocabulary tile, request tile) programs. Per slot:

1. ``stats``: each program forms ``x = (U + W1[prev] · W2ᵀ) / T`` for its tile of requests and vocabulary
   (the rank-r bias is a small matrix product, so every W2 tile is read once per request tile, not once
   per request) and writes the tile's max and sum of ``exp(x − max)`` (greedy: max and first argmax).
2. ``normalize`` (one program per request): the tile statistics combined into the row's max and
   normaliser (greedy: the token). Top-k and top-p thresholds are searched here over ``x``, which step 1
   then also wrote into the output row as scratch: top-k walks distinct values downward counting ties
   (at most k passes), top-p bisects on the bit patterns of non-negative floats (which order like the
   floats) with integer fixed-point masses, 30 passes in fp32 and 62 in fp64, keeping v iff the mass
   strictly more probable than v is below ``⌈top_p · 2^48⌉`` (the reference's rule).
3. ``probs``: each program recomputes ``x`` for its tile (cheaper than a scratch round trip when there is
   no top-k or top-p), writes the final probabilities once, and the tile's fixed-point mass.
4. ``draw`` (one program per request): tile masses → prefix → the one tile that holds ``⌊u · total⌋`` →
   the scan inside it (``dspark.sampling``'s fixed-point rule, so ties at boundaries resolve as in every
   other tier); the drawn token becomes the next slot's previous token.

Gated and RNN heads carry a hidden-state matvec per slot that does not fit this tiling cleanly; they run on
the PyTorch path (``backend="auto"`` picks it; ``backend="triton"`` refuses them).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from dspark.kernels._sampling import draw_in_tile, draw_threshold, find_tile, fixed_point
from dspark.kernels._tuning import accumulator, empty_output, interpreting, launch, next_power_of_2, select_config

from dspark.sampling import top_p_threshold

# BLOCK_V: vocabulary tile; BLOCK_K: rank chunk of the bias product. The request tile is sized from R. Never
# autotuned: all four kernels of a slot must run with the same vocabulary tile.
CONFIGS = {
    "interpreter": [dict(BLOCK_V=16, BLOCK_K=16, num_warps=1, num_stages=1)],
    # 64-wide vocabulary tiles: at 128 the probability kernel spilled 128-168 B with top-k/top-p scratch
    # (compile_matrix.py); at 64 no kernel of the sampler spills. Never run on Blackwell.
    "sm90": [dict(BLOCK_V=64, BLOCK_K=32, num_warps=8, num_stages=3,
                  label="compiled sm_90 (Triton 3.9, paper shapes, all four kernels): <= 155 regs, 0 B spill, wgmma; "
                        "timed on an H200 (Triton 3.6, 2026-12-04)")],
    "sm100": [dict(BLOCK_V=64, BLOCK_K=32, num_warps=8, num_stages=3,
                   label="compiled sm_100/sm_103 (Triton 3.9, paper shapes, all four kernels): <= 146 regs, 0 B spill, "
                         "tcgen05; unmeasured")],
    "other": [dict(BLOCK_V=128, BLOCK_K=32, num_warps=4, num_stages=2)],
}
MAX_BLOCK_R = 64
BLOCK_T = 128  # tiles combined per step by the per-request programs


@triton.jit
def _slot_logits(base_ptr, prev_ptr, w1_ptr, w2_ptr, params_ptr, offs_r, mask_r, offs_v, mask_v, k, rank,
                 stride_br, stride_bk, stride_w1, stride_w2,
                 HAS_MARKOV: tl.constexpr, GREEDY: tl.constexpr, BLOCK_R: tl.constexpr,
                 BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr, ACC: tl.constexpr):
    """``[BLOCK_R, BLOCK_V]`` logits ``(U + bias) / T`` of slot k (greedy: ``U + bias``), ``-inf`` outside."""
    mask = mask_r[:, None] & mask_v[None, :]
    x = tl.load(base_ptr + offs_r[:, None] * stride_br + k * stride_bk + offs_v[None, :], mask=mask,
                other=0.0).to(ACC)
    if HAS_MARKOV:
        prev = tl.load(prev_ptr + offs_r, mask=mask_r, other=0)
        bias = tl.zeros([BLOCK_R, BLOCK_V], ACC)
        for r0 in range(0, rank, BLOCK_K):
            offs_k = r0 + tl.arange(0, BLOCK_K)
            mask_k = offs_k < rank
            e = tl.load(w1_ptr + prev[:, None] * stride_w1 + offs_k[None, :],
                        mask=mask_r[:, None] & mask_k[None, :], other=0.0)
            w2 = tl.load(w2_ptr + offs_v[None, :] * stride_w2 + offs_k[:, None],
                         mask=mask_k[:, None] & mask_v[None, :], other=0.0)
            # "ieee": fp32 weights must not be rounded to tf32 (fp64 ones run on DMMA, bf16 on the tensor cores).
            bias += tl.dot(e, w2, input_precision="ieee", out_dtype=ACC)
        x = x + bias
    if not GREEDY:
        x = x / tl.load(params_ptr).to(ACC)  # a division, as the reference divides (not x · 1/T)
    return tl.where(mask, x, float("-inf"))


@triton.jit
def _grid_tile(requests, vocab, BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr):
    """This program's vocabulary tile and request tile, shared by the two grid kernels so their tilings agree."""
    tile = tl.program_id(0)
    offs_v = tile * BLOCK_V + tl.arange(0, BLOCK_V)
    offs_r = (tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
    return tile, offs_v, offs_r, offs_v < vocab, offs_r < requests


@triton.jit
def _stats_kernel(
    base_ptr, prev_ptr, w1_ptr, w2_ptr, params_ptr, probs_ptr, tile_max_ptr, tile_sum_ptr, tile_arg_ptr,
    k, requests, vocab, rank, num_tiles,
    stride_br, stride_bk, stride_w1, stride_w2, stride_pr, stride_pk,
    HAS_MARKOV: tl.constexpr, GREEDY: tl.constexpr, SCRATCH: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr, ACC: tl.constexpr,
):
    """Step 1 of the module docstring for one (vocabulary tile, request tile): tile max and sum-exp, or first argmax."""
    tile, offs_v, offs_r, mask_v, mask_r = _grid_tile(requests, vocab, BLOCK_R, BLOCK_V)
    x = _slot_logits(base_ptr, prev_ptr, w1_ptr, w2_ptr, params_ptr, offs_r, mask_r, offs_v, mask_v, k, rank,
                     stride_br, stride_bk, stride_w1, stride_w2,
                     HAS_MARKOV, GREEDY, BLOCK_R, BLOCK_V, BLOCK_K, ACC)
    if SCRATCH:
        tl.store(probs_ptr + offs_r[:, None] * stride_pr + k * stride_pk + offs_v[None, :], x,
                 mask=mask_r[:, None] & mask_v[None, :])
    m = tl.max(x, 1)
    out = offs_r * num_tiles + tile
    tl.store(tile_max_ptr + out, m, mask=mask_r)
    if GREEDY:
        arg = tl.min(tl.where(x == m[:, None], offs_v[None, :], vocab), 1).to(tl.int64)
        tl.store(tile_arg_ptr + out, arg, mask=mask_r)
    else:
        m = tl.where(mask_r, m, 0.0)  # rows past the batch hold only -inf: keep their exp at 0, not NaN
        tl.store(tile_sum_ptr + out, tl.sum(tl.exp(x - m[:, None]), 1), mask=mask_r)


@triton.jit
def _normalize_kernel(
    tile_max_ptr, tile_sum_ptr, tile_arg_ptr, probs_ptr, row_ptr, cutoff_ptr, tokens_ptr, prev_ptr, d2t_ptr,
    k, vocab, num_tiles, top_k, top_p_fixed, stride_pr, stride_pk, stride_tr,
    HAS_D2T: tl.constexpr, GREEDY: tl.constexpr, TOP_K: tl.constexpr, TOP_P: tl.constexpr, KEY: tl.constexpr,
    P_STEPS: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr, ACC: tl.constexpr,
):
    """Row max and normaliser (and top-k / top-p thresholds) of request ``program_id(0)``; greedy: its token."""
    r = tl.program_id(0).to(tl.int64)
    neg_inf = tl.full([], float("-inf"), ACC)
    run_max = neg_inf
    for t0 in range(0, num_tiles, BLOCK_T):
        offs = t0 + tl.arange(0, BLOCK_T)
        run_max = tl.maximum(run_max, tl.max(tl.load(tile_max_ptr + r * num_tiles + offs, mask=offs < num_tiles,
                                                     other=float("-inf")), 0))
    if GREEDY:
        token = tl.full([], vocab, tl.int64)
        for t0 in range(0, num_tiles, BLOCK_T):
            offs = t0 + tl.arange(0, BLOCK_T)
            mask = offs < num_tiles
            m = tl.load(tile_max_ptr + r * num_tiles + offs, mask=mask, other=float("-inf"))
            arg = tl.load(tile_arg_ptr + r * num_tiles + offs, mask=mask, other=vocab)
            token = tl.minimum(token, tl.min(tl.where(m == run_max, arg, vocab), 0))
        tl.store(tokens_ptr + r * stride_tr + k, token)
        if HAS_D2T:
            tl.store(prev_ptr + r, tl.load(d2t_ptr + token).to(tl.int64))
        else:
            tl.store(prev_ptr + r, token)
    else:
        run_sum = tl.full([], 0.0, ACC)
        for t0 in range(0, num_tiles, BLOCK_T):
            offs = t0 + tl.arange(0, BLOCK_T)
            mask = offs < num_tiles
            m = tl.load(tile_max_ptr + r * num_tiles + offs, mask=mask, other=float("-inf"))
            s = tl.load(tile_sum_ptr + r * num_tiles + offs, mask=mask, other=0.0)
            run_sum += tl.sum(tl.where(mask, s * tl.exp(m - run_max), 0.0), 0)
        row = probs_ptr + r * stride_pr + k * stride_pk
        kth = neg_inf
        if TOP_K:
            # k-th largest logit: walk distinct values downward, counting ties, until k are covered.
            covered = tl.full([], 0, tl.int64)
            ceiling = tl.full([], float("inf"), ACC)
            for _ in range(top_k):
                if covered < top_k:
                    level = neg_inf
                    for v0 in range(0, vocab, BLOCK_V):
                        offs = v0 + tl.arange(0, BLOCK_V)
                        x = tl.load(row + offs, mask=offs < vocab, other=float("-inf"))
                        level = tl.maximum(level, tl.max(tl.where(x < ceiling, x, float("-inf")), 0))
                    count = tl.full([], 0, tl.int64)
                    for v0 in range(0, vocab, BLOCK_V):
                        offs = v0 + tl.arange(0, BLOCK_V)
                        x = tl.load(row + offs, mask=offs < vocab, other=float("-inf"))
                        count += tl.sum((x == level).to(tl.int64), 0)
                    covered += count
                    kth = level
                    ceiling = level
            run_sum = tl.full([], 0.0, ACC)
            for v0 in range(0, vocab, BLOCK_V):
                offs = v0 + tl.arange(0, BLOCK_V)
                x = tl.load(row + offs, mask=offs < vocab, other=float("-inf"))
                run_sum += tl.sum(tl.where(x >= kth, tl.exp(x - run_max), 0.0), 0)
        cutoff_key = tl.full([], -1, tl.int64)
        kept_mass = tl.full([], 1.0, ACC)
        if TOP_P:
            # Smallest probability t with fixed-point mass(p > t) < ⌈top_p · 2^48⌉, by bisection on its bits.
            lo = tl.full([], -1, tl.int64)
            hi = tl.full([], 1.0, ACC).to(KEY, bitcast=True).to(tl.int64)
            for _ in range(P_STEPS):
                mid = (lo + hi) >> 1
                above = tl.full([], 0, tl.int64)
                for v0 in range(0, vocab, BLOCK_V):
                    offs = v0 + tl.arange(0, BLOCK_V)
                    x = tl.load(row + offs, mask=offs < vocab, other=float("-inf"))
                    p = tl.where(x >= kth, tl.exp(x - run_max) / run_sum, 0.0)
                    above += tl.sum(tl.where(p.to(KEY, bitcast=True).to(tl.int64) > mid, fixed_point(p), 0), 0)
                small = above < top_p_fixed
                hi = tl.where(small, mid, hi)
                lo = tl.where(small, lo, mid)
            cutoff_key = hi
            kept_mass = tl.full([], 0.0, ACC)
            for v0 in range(0, vocab, BLOCK_V):
                offs = v0 + tl.arange(0, BLOCK_V)
                x = tl.load(row + offs, mask=offs < vocab, other=float("-inf"))
                p = tl.where(x >= kth, tl.exp(x - run_max) / run_sum, 0.0)
                kept_mass += tl.sum(tl.where(p.to(KEY, bitcast=True).to(tl.int64) >= cutoff_key, p, 0.0), 0)
        tl.store(row_ptr + r * 4, run_max)
        tl.store(row_ptr + r * 4 + 1, run_sum)
        tl.store(row_ptr + r * 4 + 2, kth)
        tl.store(row_ptr + r * 4 + 3, kept_mass)
        tl.store(cutoff_ptr + r, cutoff_key)


@triton.jit
def _probs_kernel(
    base_ptr, prev_ptr, w1_ptr, w2_ptr, params_ptr, probs_ptr, row_ptr, cutoff_ptr, tokens_ptr,
    mass_ptr, last_ptr, k, requests, vocab, rank, num_tiles,
    stride_br, stride_bk, stride_w1, stride_w2, stride_pr, stride_pk, stride_tr,
    HAS_MARKOV: tl.constexpr, GREEDY: tl.constexpr, SCRATCH: tl.constexpr,
    TOP_K: tl.constexpr, TOP_P: tl.constexpr, KEY: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr, ACC: tl.constexpr,
):
    """Step 3 of the module docstring for one (vocabulary tile, request tile): the final probabilities, written
    once, and the tile's fixed-point mass and last index of positive mass."""
    tile, offs_v, offs_r, mask_v, mask_r = _grid_tile(requests, vocab, BLOCK_R, BLOCK_V)
    mask = mask_r[:, None] & mask_v[None, :]
    out = probs_ptr + offs_r[:, None] * stride_pr + k * stride_pk + offs_v[None, :]
    if GREEDY:
        token = tl.load(tokens_ptr + offs_r * stride_tr + k, mask=mask_r, other=-1)
        tl.store(out, tl.where(offs_v[None, :] == token[:, None], 1.0, 0.0).to(ACC), mask=mask)
    else:
        if SCRATCH:
            x = tl.load(out, mask=mask, other=float("-inf"))
        else:
            x = _slot_logits(base_ptr, prev_ptr, w1_ptr, w2_ptr, params_ptr, offs_r, mask_r, offs_v, mask_v, k,
                             rank, stride_br, stride_bk, stride_w1, stride_w2,
                             HAS_MARKOV, GREEDY, BLOCK_R, BLOCK_V, BLOCK_K, ACC)
        run_max = tl.load(row_ptr + offs_r * 4, mask=mask_r, other=0.0)
        run_sum = tl.load(row_ptr + offs_r * 4 + 1, mask=mask_r, other=1.0)
        p = tl.exp(x - run_max[:, None]) / run_sum[:, None]
        if TOP_K:
            kth = tl.load(row_ptr + offs_r * 4 + 2, mask=mask_r, other=0.0)
            p = tl.where(x >= kth[:, None], p, 0.0)
        if TOP_P:
            kept = tl.load(row_ptr + offs_r * 4 + 3, mask=mask_r, other=1.0)
            cutoff = tl.load(cutoff_ptr + offs_r, mask=mask_r, other=0)
            p = tl.where(p.to(KEY, bitcast=True).to(tl.int64) >= cutoff[:, None], p / kept[:, None], 0.0)
        p = tl.where(mask, p, 0.0)
        tl.store(out, p, mask=mask)
        w = fixed_point(p)
        cell = offs_r * num_tiles + tile
        tl.store(mass_ptr + cell, tl.sum(w, 1), mask=mask_r)
        tl.store(last_ptr + cell, tl.max(tl.where(w > 0, offs_v[None, :], -1).to(tl.int64), 1), mask=mask_r)


@triton.jit
def _draw_kernel(
    probs_ptr, u_ptr, mass_ptr, last_ptr, tokens_ptr, prev_ptr, d2t_ptr,
    k, vocab, num_tiles, stride_pr, stride_pk, stride_ur, stride_tr,
    HAS_D2T: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr, ACC: tl.constexpr,
):
    """Fixed-point inverse-CDF draw of request ``program_id(0)``'s slot k; the token is the next ``prev``."""
    r = tl.program_id(0).to(tl.int64)
    total = tl.full([], 0, tl.int64)
    for t0 in range(0, num_tiles, BLOCK_T):
        offs = t0 + tl.arange(0, BLOCK_T)
        total += tl.sum(tl.load(mass_ptr + r * num_tiles + offs, mask=offs < num_tiles, other=0), 0)
    threshold = draw_threshold(tl.load(u_ptr + r * stride_ur + k), total)
    tile, before, last = find_tile(mass_ptr + r * num_tiles, last_ptr + r * num_tiles, num_tiles, threshold, BLOCK_T)
    offs = tile.to(tl.int64) * BLOCK_V + tl.arange(0, BLOCK_V)
    mask = offs < vocab
    p = tl.load(probs_ptr + r * stride_pr + k * stride_pk + offs, mask=mask, other=0.0).to(ACC)
    token = tl.minimum(tile * BLOCK_V + draw_in_tile(fixed_point(p), mask, before, threshold), last)
    tl.store(tokens_ptr + r * stride_tr + k, token)
    if HAS_D2T:
        tl.store(prev_ptr + r, tl.load(d2t_ptr + token).to(tl.int64))
    else:
        tl.store(prev_ptr + r, token)


def markov_sample_block(base_logits, hidden, anchor_ids, uniforms, weights, *, temperature=1.0, top_k=None,
                        top_p=None, draft_to_target=None):
    """Triton launcher with the signature of ``dspark.markov.sample_block`` (inputs validated there)."""
    if weights is not None and weights.head_type != "vanilla":
        raise ValueError(
            f"the Triton Markov sampler implements vanilla heads (the kind vLLM serves), not "
            f"{weights.head_type!r}: use backend='torch' or 'auto'"
        )
    num_requests, gamma, vocab = base_logits.shape
    device = base_logits.device
    acc = accumulator(base_logits.dtype)
    out_dtype = torch.float64 if base_logits.dtype == torch.float64 else torch.float32
    tokens = empty_output(num_requests, gamma, dtype=torch.long, device=device)
    probs = empty_output(num_requests, gamma, vocab, dtype=out_dtype, device=device)
    if num_requests == 0:
        return tokens, probs
    base_logits, uniforms = base_logits.contiguous(), uniforms.contiguous()
    has_markov = weights is not None
    w1 = weights.w1.contiguous() if has_markov else base_logits
    w2 = weights.w2.contiguous() if has_markov else base_logits
    if w1.dtype != w2.dtype:  # the bias product takes one operand dtype: the wider one, never rounding down
        common = torch.promote_types(w1.dtype, w2.dtype)
        w1, w2 = w1.to(common), w2.to(common)
    if interpreting() and w1.dtype in (torch.bfloat16, torch.float16):
        # Triton's interpreter multiplies half-precision tl.dot tiles wrongly (a bf16 drafter drew one token in
        # every slot). A product of two half-precision numbers is exact in fp32, which is what a GPU's tensor
        # cores accumulate in, so fp32 copies give the interpreter the same arithmetic.
        w1, w2 = w1.float(), w2.float()
    rank = weights.rank if has_markov else 0
    greedy = temperature == 0
    use_top_k = top_k is not None and top_k < vocab and not greedy
    use_top_p = top_p is not None and top_p < 1 and not greedy
    scratch = use_top_k or use_top_p
    block_r = min(MAX_BLOCK_R, max(16, next_power_of_2(num_requests)))
    # The four kernels of a slot must agree on the vocabulary tiling: each launch takes the same (first) config
    # of CONFIGS, and every kernel accepts all of its block sizes.
    key = (vocab, rank, block_r)
    config = select_config("markov", device, CONFIGS, lambda c: True, key)
    num_tiles = triton.cdiv(vocab, config["BLOCK_V"])
    params = torch.tensor([temperature if not greedy else 1.0], dtype=out_dtype, device=device)
    prev = anchor_ids.to(torch.long).contiguous().clone()
    d2t = draft_to_target.contiguous() if draft_to_target is not None else prev
    tile_max = torch.empty(num_requests, num_tiles, dtype=out_dtype, device=device)
    tile_sum = torch.empty_like(tile_max)
    tile_arg = torch.empty(num_requests, num_tiles, dtype=torch.long, device=device)
    mass = torch.empty(num_requests, num_tiles, dtype=torch.long, device=device)
    last = torch.empty_like(mass)
    row = torch.empty(num_requests, 4, dtype=out_dtype, device=device)
    cutoff = torch.empty(num_requests, dtype=torch.long, device=device)
    shared = dict(HAS_MARKOV=has_markov, GREEDY=greedy, BLOCK_R=block_r, ACC=acc)
    tiled = (num_tiles, triton.cdiv(num_requests, block_r))
    strides = (base_logits.stride(0), base_logits.stride(1), w1.stride(0), w2.stride(0))
    for k in range(gamma):
        launch("markov_stats", _stats_kernel, tiled,
               (base_logits, prev, w1, w2, params, probs, tile_max, tile_sum, tile_arg,
                k, num_requests, vocab, rank, num_tiles, *strides, probs.stride(0), probs.stride(1)),
               dict(shared, SCRATCH=scratch), device=device, table=CONFIGS, key=key, tunable=False, config=config)
        launch("markov_normalize", _normalize_kernel, (num_requests,),
               (tile_max, tile_sum, tile_arg, probs, row, cutoff, tokens, prev, d2t, k, vocab, num_tiles,
                top_k if use_top_k else 0, top_p_threshold(top_p) if use_top_p else 0,
                probs.stride(0), probs.stride(1), tokens.stride(0)),
               dict(HAS_D2T=draft_to_target is not None, GREEDY=greedy, TOP_K=use_top_k, TOP_P=use_top_p,
                    KEY=tl.int64 if out_dtype == torch.float64 else tl.int32,
                    P_STEPS=62 if out_dtype == torch.float64 else 30, BLOCK_T=BLOCK_T, ACC=acc),
               device=device, table=CONFIGS, key=key, tunable=False, config=config)
        launch("markov_probs", _probs_kernel, tiled,
               (base_logits, prev, w1, w2, params, probs, row, cutoff, tokens, mass, last,
                k, num_requests, vocab, rank, num_tiles, *strides, probs.stride(0), probs.stride(1), tokens.stride(0)),
               dict(shared, SCRATCH=scratch, TOP_K=use_top_k, TOP_P=use_top_p,
                    KEY=tl.int64 if out_dtype == torch.float64 else tl.int32),
               device=device, table=CONFIGS, key=key, tunable=False, config=config)
        if not greedy:
            launch("markov_draw", _draw_kernel, (num_requests,),
                   (probs, uniforms, mass, last, tokens, prev, d2t, k, vocab, num_tiles,
                    probs.stride(0), probs.stride(1), uniforms.stride(0), tokens.stride(0)),
                   dict(HAS_D2T=draft_to_target is not None, BLOCK_T=BLOCK_T, ACC=acc),
                   device=device, table=CONFIGS, key=key, tunable=False, config=config)
    return tokens, probs

