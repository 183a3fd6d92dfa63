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

That is four launches a slot (three greedy), each with its host work, which at a batch of one or a few requests
costs far more than the microseconds of work. Up to ``FUSED_MAX_REQUESTS`` requests a slot is one launch
instead: ``_fused_slot_kernel`` does step 1 over the same grid, and the program that finishes last (counted
with an atomic) does steps 2 to 4 for each request, streaming its row through the same helpers, so both paths
give the same tokens and probabilities.

Gated and RNN heads carry a hidden-state matvec per slot that does not fit this tiling cleanly; they run on
the PyTorch path (``backend="auto"`` picks it; ``backend="triton"`` refuses them).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl
from dspark.kernels._sampling import draw_in_tile, draw_threshold, find_tile, fixed_point, tile_mass
from dspark.kernels._tuning import (
    accumulator,
    empty_output,
    interpreting,
    launch,
    next_power_of_2,
    planned,
    select_config,
)

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
# The one-launch slot kernel (small batches) has a table of its own, as no other kernel shares its tiling. At 64-wide
# tiles its top-k / top-p passes spilled 40-56 B on every architecture, at 128 with 4 warps 176 B on sm_90; at 128
# with 8 warps nothing spills (compile_matrix.py). Its bias product has 16 rows, too few for wgmma or tcgen05: it
# runs on mma.sync.
SLOT_CONFIGS = {
    "interpreter": CONFIGS["interpreter"],
    "sm90": [dict(BLOCK_V=128, BLOCK_K=32, num_warps=8, num_stages=2,
                  label="compiled sm_90 (Triton 3.9, paper shapes, R = 1): 128 regs, 0 B spill, mma.sync; unmeasured")],
    "sm100": [dict(BLOCK_V=128, BLOCK_K=32, num_warps=8, num_stages=2,
                   label="compiled sm_100/sm_103 (Triton 3.9, paper shapes, R = 1): <= 128 regs, 0 B spill, "
                         "mma.sync; unmeasured")],
    "other": [dict(BLOCK_V=128, BLOCK_K=32, num_warps=4, num_stages=2)],
}
MAX_BLOCK_R = 64
# Up to this many requests a slot is one launch (``_fused_slot_kernel``): the last program to finish step 1 does
# steps 2-4 for every request in turn, which costs one program's pass over each row but saves three launches
# and their host work per slot. Larger batches take the four-launch path, whose steps 2 and 4 run one program
# per request. A guess until a GPU times both paths at R = 1 to 8.
FUSED_MAX_REQUESTS = 4
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
def _tile_stats(base_ptr, prev_ptr, w1_ptr, w2_ptr, params_ptr, probs_ptr, tile_max_ptr, tile_sum_ptr, tile_arg_ptr,
                k, requests, vocab, rank, num_tiles, stride_br, stride_bk, stride_w1, stride_w2, stride_pr, stride_pk,
                HAS_MARKOV: tl.constexpr, GREEDY: tl.constexpr, SCRATCH: tl.constexpr, BLOCK_R: tl.constexpr,
                BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr, ACC: tl.constexpr):
    """Step 1 of the module docstring for this program's (vocabulary tile, request tile): tile max and sum-exp, or
    first argmax; with ``SCRATCH`` the logits ``x`` also go into the output rows."""
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
def _stats_kernel(
    base_ptr, prev_ptr, w1_ptr, w2_ptr, params_ptr, probs_ptr, tile_max_ptr, tile_sum_ptr, tile_arg_ptr,
    k, requests, vocab, rank, num_tiles,
    stride_br, stride_bk, stride_w1, stride_w2, stride_pr, stride_pk,
    HAS_MARKOV: tl.constexpr, GREEDY: tl.constexpr, SCRATCH: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr, ACC: tl.constexpr,
):
    """Step 1 of the module docstring, one program per (vocabulary tile, request tile)."""
    _tile_stats(base_ptr, prev_ptr, w1_ptr, w2_ptr, params_ptr, probs_ptr, tile_max_ptr, tile_sum_ptr, tile_arg_ptr,
                k, requests, vocab, rank, num_tiles, stride_br, stride_bk, stride_w1, stride_w2, stride_pr, stride_pk,
                HAS_MARKOV, GREEDY, SCRATCH, BLOCK_R, BLOCK_V, BLOCK_K, ACC)


@triton.jit
def _row_argmax(tile_max_ptr, tile_arg_ptr, r, vocab, num_tiles, BLOCK_T: tl.constexpr, ACC: tl.constexpr):
    """Request r's greedy token: the first index of the row maximum, from its tiles' maxima and argmaxes."""
    run_max = tl.full([], float("-inf"), ACC)
    for t0 in range(0, num_tiles, BLOCK_T):
        offs = t0 + tl.arange(0, BLOCK_T)
        run_max = tl.maximum(run_max, tl.max(tl.load(tile_max_ptr + r * num_tiles + offs, mask=offs < num_tiles,
                                                     other=float("-inf")), 0))
    token = tl.full([], vocab, tl.int64)
    for t0 in range(0, num_tiles, BLOCK_T):
        offs = t0 + tl.arange(0, BLOCK_T)
        mask = offs < num_tiles
        m = tl.load(tile_max_ptr + r * num_tiles + offs, mask=mask, other=float("-inf"))
        arg = tl.load(tile_arg_ptr + r * num_tiles + offs, mask=mask, other=vocab)
        token = tl.minimum(token, tl.min(tl.where(m == run_max, arg, vocab), 0))
    return token


@triton.jit
def _row_normaliser(tile_max_ptr, tile_sum_ptr, row, r, vocab, num_tiles, top_k, top_p_fixed,
                    TOP_K: tl.constexpr, TOP_P: tl.constexpr, KEY: tl.constexpr, P_STEPS: tl.constexpr,
                    BLOCK_T: tl.constexpr, BLOCK_V: tl.constexpr, ACC: tl.constexpr):
    """Request r's row max and normaliser from its tiles' statistics, then its top-k threshold and top-p cutoff
    searched over the logits ``x`` held in ``row``. Returns ``(max, normaliser, k-th logit, kept mass, cutoff)``."""
    neg_inf = tl.full([], float("-inf"), ACC)
    run_max = neg_inf
    for t0 in range(0, num_tiles, BLOCK_T):
        offs = t0 + tl.arange(0, BLOCK_T)
        run_max = tl.maximum(run_max, tl.max(tl.load(tile_max_ptr + r * num_tiles + offs, mask=offs < num_tiles,
                                                     other=float("-inf")), 0))
    run_sum = tl.full([], 0.0, ACC)
    for t0 in range(0, num_tiles, BLOCK_T):
        offs = t0 + tl.arange(0, BLOCK_T)
        mask = offs < num_tiles
        m = tl.load(tile_max_ptr + r * num_tiles + offs, mask=mask, other=float("-inf"))
        s = tl.load(tile_sum_ptr + r * num_tiles + offs, mask=mask, other=0.0)
        run_sum += tl.sum(tl.where(mask, s * tl.exp(m - run_max), 0.0), 0)
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
    return run_max, run_sum, kth, kept_mass, cutoff_key


@triton.jit
def _warp(x, run_max, run_sum, kth, kept, cutoff, TOP_K: tl.constexpr, TOP_P: tl.constexpr, KEY: tl.constexpr):
    """Final probabilities of logits ``x`` (any shape; the row quantities broadcast against it)."""
    p = tl.exp(x - run_max) / run_sum
    if TOP_K:
        p = tl.where(x >= kth, p, 0.0)
    if TOP_P:
        p = tl.where(p.to(KEY, bitcast=True).to(tl.int64) >= cutoff, p / kept, 0.0)
    return p


@triton.jit
def _set_token(tokens_ptr, prev_ptr, d2t_ptr, r, k, token, stride_tr, HAS_D2T: tl.constexpr):
    """Store slot k's token; in target ids it is the previous token of slot k + 1."""
    tl.store(tokens_ptr + r * stride_tr + k, token)
    if HAS_D2T:
        tl.store(prev_ptr + r, tl.load(d2t_ptr + token).to(tl.int64))
    else:
        tl.store(prev_ptr + r, token)


@triton.jit
def _normalize_kernel(
    tile_max_ptr, tile_sum_ptr, tile_arg_ptr, probs_ptr, row_ptr, cutoff_ptr, tokens_ptr, prev_ptr, d2t_ptr,
    k, vocab, num_tiles, top_k, top_p_fixed, stride_pr, stride_pk, stride_tr,
    HAS_D2T: tl.constexpr, GREEDY: tl.constexpr, TOP_K: tl.constexpr, TOP_P: tl.constexpr, KEY: tl.constexpr,
    P_STEPS: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr, ACC: tl.constexpr,
):
    """Row max and normaliser (and top-k / top-p thresholds) of request ``program_id(0)``; greedy: its token."""
    r = tl.program_id(0).to(tl.int64)
    if GREEDY:
        token = _row_argmax(tile_max_ptr, tile_arg_ptr, r, vocab, num_tiles, BLOCK_T, ACC)
        _set_token(tokens_ptr, prev_ptr, d2t_ptr, r, k, token, stride_tr, HAS_D2T)
    else:
        run_max, run_sum, kth, kept_mass, cutoff_key = _row_normaliser(
            tile_max_ptr, tile_sum_ptr, probs_ptr + r * stride_pr + k * stride_pk, r, vocab, num_tiles, top_k,
            top_p_fixed, TOP_K, TOP_P, KEY, P_STEPS, BLOCK_T, BLOCK_V, ACC)
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
        kth = tl.load(row_ptr + offs_r * 4 + 2, mask=mask_r, other=0.0)
        kept = tl.load(row_ptr + offs_r * 4 + 3, mask=mask_r, other=1.0)
        cutoff = tl.load(cutoff_ptr + offs_r, mask=mask_r, other=0)
        p = _warp(x, run_max[:, None], run_sum[:, None], kth[:, None], kept[:, None], cutoff[:, None],
                  TOP_K, TOP_P, KEY)
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
    _set_token(tokens_ptr, prev_ptr, d2t_ptr, r, k, token, stride_tr, HAS_D2T)


@triton.jit
def _fused_slot_kernel(
    base_ptr, prev_ptr, w1_ptr, w2_ptr, params_ptr, probs_ptr, tile_max_ptr, tile_sum_ptr, tile_arg_ptr,
    u_ptr, tokens_ptr, d2t_ptr, arrived_ptr, k, requests, vocab, rank, num_tiles, top_k, top_p_fixed,
    stride_br, stride_bk, stride_w1, stride_w2, stride_pr, stride_pk, stride_ur, stride_tr,
    HAS_MARKOV: tl.constexpr, GREEDY: tl.constexpr, HAS_D2T: tl.constexpr, TOP_K: tl.constexpr,
    TOP_P: tl.constexpr, KEY: tl.constexpr, P_STEPS: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr, ACC: tl.constexpr,
):
    """All four steps of a slot in one launch, for a batch that fits one request tile.

    Every program does step 1 for its vocabulary tile (the logits ``x`` kept in the output rows); the program that
    finishes last, counted on ``arrived_ptr``, then does steps 2 to 4 for each request, streaming its row: the same
    statistics, combined in the same order, so the tokens and probabilities are those of the four-launch path.
    """
    _tile_stats(base_ptr, prev_ptr, w1_ptr, w2_ptr, params_ptr, probs_ptr, tile_max_ptr, tile_sum_ptr, tile_arg_ptr,
                k, requests, vocab, rank, num_tiles, stride_br, stride_bk, stride_w1, stride_w2, stride_pr, stride_pk,
                HAS_MARKOV, GREEDY, True, BLOCK_R, BLOCK_V, BLOCK_K, ACC)
    # The barrier orders every thread's stores before the counter's release (acq_rel, GPU scope); the last program
    # acquires them all with its increment, and the second barrier hands that on to its other threads.
    tl.debug_barrier()
    arrived = tl.atomic_add(arrived_ptr + k, 1)
    if arrived == num_tiles - 1:
        tl.debug_barrier()
        for r in range(0, requests):
            row = probs_ptr + r * stride_pr + k * stride_pk
            if GREEDY:
                token = _row_argmax(tile_max_ptr, tile_arg_ptr, r, vocab, num_tiles, BLOCK_T, ACC)
                for v0 in range(0, vocab, BLOCK_V):
                    offs = v0 + tl.arange(0, BLOCK_V)
                    tl.store(row + offs, tl.where(offs == token, 1.0, 0.0).to(ACC), mask=offs < vocab)
            else:
                run_max, run_sum, kth, kept, cutoff = _row_normaliser(
                    tile_max_ptr, tile_sum_ptr, row, r, vocab, num_tiles, top_k, top_p_fixed,
                    TOP_K, TOP_P, KEY, P_STEPS, BLOCK_T, BLOCK_V, ACC)
                # Step 3 in place (each thread rewrites the logits it reads), with the row's fixed-point mass.
                total = tl.full([], 0, tl.int64)
                last = tl.full([], -1, tl.int64)
                for v0 in range(0, vocab, BLOCK_V):
                    offs = v0 + tl.arange(0, BLOCK_V)
                    mask = offs < vocab
                    x = tl.load(row + offs, mask=mask, other=float("-inf"))
                    p = tl.where(mask, _warp(x, run_max, run_sum, kth, kept, cutoff, TOP_K, TOP_P, KEY), 0.0)
                    tl.store(row + offs, p, mask=mask)
                    mass, tile_last = tile_mass(fixed_point(p), offs, mask)
                    total += mass
                    last = tl.maximum(last, tile_last)
                tl.debug_barrier()
                # Step 4: the count of entries whose cumulative mass stays <= ⌊u · total⌋ is the drawn index.
                threshold = draw_threshold(tl.load(u_ptr + r * stride_ur + k), total)
                token = tl.full([], 0, tl.int64)
                before = tl.full([], 0, tl.int64)
                for v0 in range(0, vocab, BLOCK_V):
                    offs = v0 + tl.arange(0, BLOCK_V)
                    mask = offs < vocab
                    w = fixed_point(tl.load(row + offs, mask=mask, other=0.0).to(ACC))
                    token += draw_in_tile(w, mask, before, threshold)
                    before += tl.sum(tl.where(mask, w, 0), 0)
                token = tl.minimum(token, last)
            _set_token(tokens_ptr, prev_ptr, d2t_ptr, r, k, token, stride_tr, HAS_D2T)


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
    out_dtype = torch.float64 if base_logits.dtype == torch.float64 else torch.float32
    tokens = empty_output(num_requests, gamma, dtype=torch.long, device=device)
    probs = empty_output(num_requests, gamma, vocab, dtype=out_dtype, device=device)
    if num_requests == 0:
        return tokens, probs
    has_markov = weights is not None
    w1 = weights.w1.contiguous() if has_markov else base_logits
    w2 = weights.w2.contiguous() if has_markov else base_logits
    has_d2t = draft_to_target is not None
    key = ("markov", num_requests, gamma, vocab, base_logits.dtype, device, has_markov, w1.dtype, w2.dtype,
           weights.rank if has_markov else 0, temperature, top_k, top_p, has_d2t)
    plan = planned(key, lambda: _plan(num_requests, gamma, vocab, base_logits.dtype, device, weights, w1.dtype,
                                      w2.dtype, temperature, top_k, top_p, has_d2t))
    if has_markov and w1.dtype != plan.operand_dtype:
        w1 = w1.to(plan.operand_dtype)
    if has_markov and w2.dtype != plan.operand_dtype:
        w2 = w2.to(plan.operand_dtype)
    base_logits, uniforms = base_logits.contiguous(), uniforms.contiguous()
    prev = anchor_ids.to(torch.long, copy=True)  # the kernels overwrite it with each slot's token
    d2t = draft_to_target.contiguous() if has_d2t else prev
    tile_max = torch.empty(num_requests, plan.num_tiles, dtype=out_dtype, device=device)
    tile_sum = tile_max if plan.greedy else torch.empty_like(tile_max)
    tile_arg = torch.empty(num_requests, plan.num_tiles, dtype=torch.long, device=device) if plan.greedy else prev
    head = (base_logits, prev, w1, w2, plan.params, probs, tile_max, tile_sum, tile_arg)
    stride_pr, stride_pk, stride_ur, stride_tr = probs.stride(0), probs.stride(1), uniforms.stride(0), tokens.stride(0)
    strides = (base_logits.stride(0), base_logits.stride(1), w1.stride(0), w2.stride(0), stride_pr, stride_pk)
    if plan.one_launch:
        arrived = torch.zeros(gamma, dtype=torch.int32, device=device)
        for k in range(gamma):
            launch("markov_slot", _fused_slot_kernel, plan.grid,
                   (*head, uniforms, tokens, d2t, arrived, k, num_requests, vocab, plan.rank, plan.num_tiles,
                    *plan.top, *strides, stride_ur, stride_tr),
                   plan.slot_flags, device=device, table=SLOT_CONFIGS, key=None, tunable=False, config=plan.config)
        return tokens, probs
    mass = torch.empty(num_requests, plan.num_tiles, dtype=torch.long, device=device)
    last = torch.empty_like(mass)
    row = torch.empty(num_requests, 4, dtype=out_dtype, device=device)
    cutoff = torch.empty(num_requests, dtype=torch.long, device=device)
    for k in range(gamma):
        launch("markov_stats", _stats_kernel, plan.grid,
               (*head, k, num_requests, vocab, plan.rank, plan.num_tiles, *strides),
               plan.stats_flags, device=device, table=CONFIGS, key=None, tunable=False, config=plan.config)
        launch("markov_normalize", _normalize_kernel, (num_requests,),
               (tile_max, tile_sum, tile_arg, probs, row, cutoff, tokens, prev, d2t, k, vocab, plan.num_tiles,
                *plan.top, stride_pr, stride_pk, stride_tr),
               plan.normalize_flags, device=device, table=CONFIGS, key=None, tunable=False, config=plan.config)
        launch("markov_probs", _probs_kernel, plan.grid,
               (base_logits, prev, w1, w2, plan.params, probs, row, cutoff, tokens, mass, last,
                k, num_requests, vocab, plan.rank, plan.num_tiles, *strides, stride_tr),
               plan.probs_flags, device=device, table=CONFIGS, key=None, tunable=False, config=plan.config)
        if not plan.greedy:
            launch("markov_draw", _draw_kernel, (num_requests,),
                   (probs, uniforms, mass, last, tokens, prev, d2t, k, vocab, plan.num_tiles,
                    stride_pr, stride_pk, stride_ur, stride_tr),
                   plan.draw_flags, device=device, table=CONFIGS, key=None, tunable=False, config=plan.config)
    return tokens, probs


class _Plan(NamedTuple):
    """What a sampler call derives from its shapes and options (see ``dspark.kernels._tuning.planned``)."""

    one_launch: bool
    greedy: bool
    config: dict
    num_tiles: int
    grid: tuple
    rank: int
    operand_dtype: torch.dtype
    params: torch.Tensor
    top: tuple
    slot_flags: dict
    stats_flags: dict
    normalize_flags: dict
    probs_flags: dict
    draw_flags: dict


def _plan(num_requests, gamma, vocab, dtype, device, weights, w1_dtype, w2_dtype, temperature, top_k, top_p,
          has_d2t) -> _Plan:
    has_markov = weights is not None
    # The bias product takes one operand dtype: the wider one, never rounding down.
    operand = torch.promote_types(w1_dtype, w2_dtype) if has_markov else dtype
    if interpreting() and operand in (torch.bfloat16, torch.float16):
        # Triton's interpreter multiplies half-precision tl.dot tiles wrongly (a bf16 drafter drew one token in
        # every slot). A product of two half-precision numbers is exact in fp32, which is what a GPU's tensor
        # cores accumulate in, so fp32 copies give the interpreter the same arithmetic.
        operand = torch.float32
    rank = weights.rank if has_markov else 0
    out_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    acc = accumulator(dtype)
    greedy = temperature == 0
    use_top_k = top_k is not None and top_k < vocab and not greedy
    use_top_p = top_p is not None and top_p < 1 and not greedy
    block_r = min(MAX_BLOCK_R, max(16, next_power_of_2(num_requests)))
    one_launch = num_requests <= min(FUSED_MAX_REQUESTS, block_r)  # its grid has one request tile
    # The kernels of a slot must agree on the vocabulary tiling: every launch of a call takes this one config.
    config = select_config("markov_slot" if one_launch else "markov", device, SLOT_CONFIGS if one_launch else CONFIGS,
                           lambda c: True, (vocab, rank, block_r))
    num_tiles = triton.cdiv(vocab, config["BLOCK_V"])
    flags = dict(HAS_MARKOV=has_markov, GREEDY=greedy, BLOCK_R=block_r, ACC=acc)
    key_type = tl.int64 if out_dtype == torch.float64 else tl.int32
    row_flags = dict(HAS_D2T=has_d2t, TOP_K=use_top_k, TOP_P=use_top_p, KEY=key_type,
                     P_STEPS=62 if out_dtype == torch.float64 else 30, BLOCK_T=BLOCK_T)
    scratch = use_top_k or use_top_p
    return _Plan(
        one_launch=one_launch, greedy=greedy, config=config, num_tiles=num_tiles,
        grid=(num_tiles, 1) if one_launch else (num_tiles, triton.cdiv(num_requests, block_r)), rank=rank,
        operand_dtype=operand,
        params=torch.tensor([temperature if not greedy else 1.0], dtype=out_dtype, device=device),
        top=(top_k if use_top_k else 0, top_p_threshold(top_p) if use_top_p else 0),
        slot_flags=dict(flags, **row_flags), stats_flags=dict(flags, SCRATCH=scratch),
        normalize_flags=dict(row_flags, GREEDY=greedy, ACC=acc),
        probs_flags=dict(flags, SCRATCH=scratch, TOP_K=use_top_k, TOP_P=use_top_p, KEY=key_type),
        draw_flags=dict(HAS_D2T=has_d2t, BLOCK_T=BLOCK_T, ACC=acc),
    )
