"""Fused Markov block sampler: base logits + low-rank bias, temperature, top-k, top-p, inverse-CDF draw.

Mirrors ``dspark.reference.markov.sample_block`` for vanilla Markov heads (and for no head, the DFlash
baseline). One program per request walks the γ slots in order, because slot k's bias reads the token
drawn at slot k−1. Per slot it streams the vocabulary:

1. ``x_v = (U_v + Σ_r W2[v, r] · W1[prev, r]) / T`` into the ``draft_probs`` row (used as scratch), with an
   online max and sum of exponentials (greedy: the first argmax instead);
2. top-k: the k-th largest ``x`` found by rounds of "largest value below the last one", counting ties,
   so at most k passes and ties at the boundary are kept (the reference's rule);
3. top-p: the cutoff probability found by bisection on the bit patterns of non-negative floats (which
   order like the floats), 30 passes in fp32 and 62 in fp64, keeping v iff the mass strictly more
   probable than v is below ``top_p`` (the reference's rule);
4. the final probabilities written in place, then one scan for the first index whose cumulative mass
   exceeds ``u · total``.

Gated and RNN heads carry a hidden-state matvec per slot that does not fit this streaming loop cleanly;
they run on the PyTorch path (``backend="auto"`` picks it; ``backend="triton"`` refuses them).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from dspark.kernels._sampling import inverse_cdf_tile
from dspark.kernels._tuning import accumulator, empty_output, launch

CONFIGS = {
    "interpreter": [dict(BLOCK_V=16, BLOCK_K=8, num_warps=1, num_stages=1)],
    "sm90": [dict(BLOCK_V=256, BLOCK_K=64, num_warps=8, num_stages=3),
             dict(BLOCK_V=128, BLOCK_K=64, num_warps=4, num_stages=3)],
    # Blackwell: ordered by the compile matrix's spills (benchmarks/results/compile_matrix_triton3.9.json).
    "sm100": [dict(BLOCK_V=512, BLOCK_K=32, num_warps=8, num_stages=3,
                   label="compiled sm_100/sm_103 (Triton 3.9, paper shapes): 255 regs, 376 B spill, 2 KiB smem; "
                         "never run"),
              dict(BLOCK_V=256, BLOCK_K=64, num_warps=8, num_stages=4,
                   label="compiled sm_100/sm_103 (Triton 3.9, paper shapes): 255 regs, 896 B spill, 1 KiB smem; "
                         "never run")],
    "other": [dict(BLOCK_V=128, BLOCK_K=32, num_warps=4, num_stages=2)],
}


@triton.jit
def _markov_sample_kernel(
    base_ptr, anchor_ptr, u_ptr, w1_ptr, w2_ptr, d2t_ptr, params_ptr,
    tokens_ptr, probs_ptr,
    gamma, vocab, rank, top_k,
    stride_br, stride_bk, stride_w1, stride_w2, stride_ur, stride_tr, stride_pr, stride_pk,
    HAS_MARKOV: tl.constexpr, HAS_D2T: tl.constexpr, GREEDY: tl.constexpr, TOP_K: tl.constexpr,
    TOP_P: tl.constexpr, KEY: tl.constexpr, P_STEPS: tl.constexpr,
    BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr, ACC: tl.constexpr,
):
    """Mirrors ``dspark.reference.markov.sample_block`` (vanilla head) for request ``program_id(0)``."""
    r = tl.program_id(0).to(tl.int64)
    temperature = tl.load(params_ptr).to(ACC)
    top_p = tl.load(params_ptr + 1).to(ACC)
    prev = tl.load(anchor_ptr + r).to(tl.int64)
    neg_inf = tl.full([], float("-inf"), ACC)
    for k in range(gamma):
        row = probs_ptr + r * stride_pr + k * stride_pk
        base_row = base_ptr + r * stride_br + k * stride_bk
        # Pass 1: logits into the output row, online max / sum-exp (or first argmax when greedy).
        run_max = neg_inf
        run_sum = tl.full([], 0.0, ACC)
        best_idx = tl.full([], 0, tl.int64)
        for v0 in range(0, vocab, BLOCK_V):
            offs = v0 + tl.arange(0, BLOCK_V)
            mask = offs < vocab
            x = tl.load(base_row + offs, mask=mask, other=float("-inf")).to(ACC)
            if HAS_MARKOV:
                bias = tl.zeros([BLOCK_V], ACC)
                for r0 in range(0, rank, BLOCK_K):
                    offs_k = r0 + tl.arange(0, BLOCK_K)
                    mask_k = offs_k < rank
                    e = tl.load(w1_ptr + prev * stride_w1 + offs_k, mask=mask_k, other=0.0).to(ACC)
                    w2 = tl.load(w2_ptr + offs[:, None] * stride_w2 + offs_k[None, :],
                                 mask=mask[:, None] & mask_k[None, :], other=0.0).to(ACC)
                    bias += tl.sum(w2 * e[None, :], 1)
                x = tl.where(mask, x + bias, float("-inf"))
            if GREEDY:
                tile_max = tl.max(x, 0)
                tile_arg = tl.min(tl.where(x == tile_max, offs, vocab), 0).to(tl.int64)
                best_idx = tl.where(tile_max > run_max, tile_arg, best_idx)
                run_max = tl.maximum(run_max, tile_max)
            else:
                x = x / temperature
                tl.store(row + offs, x, mask=mask)
                new_max = tl.maximum(run_max, tl.max(x, 0))
                run_sum = run_sum * tl.exp(run_max - new_max) + tl.sum(tl.exp(x - new_max), 0)
                run_max = new_max
        if GREEDY:
            token = best_idx
            for v0 in range(0, vocab, BLOCK_V):
                offs = v0 + tl.arange(0, BLOCK_V)
                tl.store(row + offs, tl.where(offs == token, 1.0, 0.0).to(ACC), mask=offs < vocab)
        else:
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
                # Smallest probability t with mass(p > t) < top_p, by bisection on its bit pattern.
                lo = tl.full([], -1, tl.int64)
                hi = tl.full([], 1.0, ACC).to(KEY, bitcast=True).to(tl.int64)
                for _ in range(P_STEPS):
                    mid = (lo + hi) >> 1
                    above = tl.full([], 0.0, ACC)
                    for v0 in range(0, vocab, BLOCK_V):
                        offs = v0 + tl.arange(0, BLOCK_V)
                        x = tl.load(row + offs, mask=offs < vocab, other=float("-inf"))
                        p = tl.where(x >= kth, tl.exp(x - run_max) / run_sum, 0.0)
                        above += tl.sum(tl.where(p.to(KEY, bitcast=True).to(tl.int64) > mid, p, 0.0), 0)
                    small = above < top_p
                    hi = tl.where(small, mid, hi)
                    lo = tl.where(small, lo, mid)
                cutoff_key = hi
                kept_mass = tl.full([], 0.0, ACC)
                for v0 in range(0, vocab, BLOCK_V):
                    offs = v0 + tl.arange(0, BLOCK_V)
                    x = tl.load(row + offs, mask=offs < vocab, other=float("-inf"))
                    p = tl.where(x >= kth, tl.exp(x - run_max) / run_sum, 0.0)
                    kept_mass += tl.sum(tl.where(p.to(KEY, bitcast=True).to(tl.int64) >= cutoff_key, p, 0.0), 0)
            # Final probabilities in place, then the inverse-CDF draw.
            total = tl.full([], 0.0, ACC)
            for v0 in range(0, vocab, BLOCK_V):
                offs = v0 + tl.arange(0, BLOCK_V)
                mask = offs < vocab
                x = tl.load(row + offs, mask=mask, other=float("-inf"))
                p = tl.where(x >= kth, tl.exp(x - run_max) / run_sum, 0.0)
                if TOP_P:
                    p = tl.where(p.to(KEY, bitcast=True).to(tl.int64) >= cutoff_key, p / kept_mass, 0.0)
                tl.store(row + offs, p, mask=mask)
                total += tl.sum(tl.where(mask, p, 0.0), 0)
            threshold = tl.load(u_ptr + r * stride_ur + k).to(ACC) * total
            carry = tl.full([], 0.0, ACC)
            below = tl.full([], 0, tl.int64)
            last_positive = tl.full([], 0, tl.int64)
            for v0 in range(0, vocab, BLOCK_V):
                offs = v0 + tl.arange(0, BLOCK_V)
                mask = offs < vocab
                p = tl.load(row + offs, mask=mask, other=0.0)
                carry, below, last_positive = inverse_cdf_tile(p, offs, mask, carry, threshold, below, last_positive)
            token = tl.minimum(below, last_positive)
        tl.store(tokens_ptr + r * stride_tr + k, token)
        if HAS_D2T:
            prev = tl.load(d2t_ptr + token).to(tl.int64)
        else:
            prev = token


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
    rank = weights.rank if has_markov else 0
    params = torch.tensor([temperature, 1.0 if top_p is None else top_p], dtype=out_dtype, device=device)
    use_top_k = top_k is not None and top_k < vocab and temperature > 0
    use_top_p = top_p is not None and top_p < 1 and temperature > 0
    args = (
        base_logits, anchor_ids.contiguous(), uniforms, w1, w2,
        draft_to_target.contiguous() if draft_to_target is not None else anchor_ids, params,
        tokens, probs,
        gamma, vocab, rank, top_k if use_top_k else 0,
        base_logits.stride(0), base_logits.stride(1), w1.stride(0), w2.stride(0), uniforms.stride(0),
        tokens.stride(0), probs.stride(0), probs.stride(1),
    )
    constexprs = dict(
        HAS_MARKOV=has_markov, HAS_D2T=draft_to_target is not None, GREEDY=temperature == 0,
        TOP_K=use_top_k, TOP_P=use_top_p,
        KEY=tl.int64 if out_dtype == torch.float64 else tl.int32,
        P_STEPS=62 if out_dtype == torch.float64 else 30,
        ACC=acc,
    )
    launch("markov", _markov_sample_kernel, (num_requests,), args, constexprs, device=device, table=CONFIGS,
           key=(vocab, rank))
    return tokens, probs
