"""Fused rejection sampler, parallel over the vocabulary: ragged batched verification with residual and
bonus sampling.

Mirrors ``dspark.reference.verify.verify`` in three launches:

1. ``accept`` (one program per request): the acceptance tests walk the γ slots reading one probability of
   each distribution, and fix the row the final token is drawn from (``p_n``, and ``q_{n+1}`` after a
   rejection).
2. ``mass`` (a program per request and vocabulary tile): the tile's fixed-point mass of the residual
   ``max(0, p_n − q_{n+1})`` and of ``p_n``, read once.
3. ``draw`` (one program per request): the residual is used iff its fixed-point mass exceeds
   ``RESIDUAL_EPS`` (in the same integers in every tier); tile masses → prefix → the tile that holds
   ``⌊u · total⌋`` → the scan inside it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from dspark.kernels._sampling import draw_in_tile, draw_threshold, find_tile, fixed_point, tile_mass
from dspark.kernels._tuning import accumulator, empty_output, launch, select_config

from dspark.contract import RESIDUAL_EPS_FIXED, VerifyOutput

CONFIGS = {
    "interpreter": [dict(BLOCK_V=16, num_warps=1, num_stages=1)],
    # The compile matrix (compile_matrix.py, Triton 3.9, R = 256) found <= 64 registers and 0 B spill for every
    # kernel of both configs on sm_90, sm_100 and sm_103; neither has run on Blackwell.
    "sm90": [dict(BLOCK_V=2048, num_warps=8, num_stages=2, label="timed on an H200 (Triton 3.6, 2026-12-04)"),
             dict(BLOCK_V=1024, num_warps=4, num_stages=2, label="unmeasured: the first fits, untuned")],
    "sm100": [dict(BLOCK_V=2048, num_warps=8, num_stages=2, label="compiled sm_100/sm_103: <= 64 regs, 0 B spill; "
                                                                   "unmeasured"),
              dict(BLOCK_V=1024, num_warps=4, num_stages=2, label="compiled sm_100/sm_103: <= 64 regs, 0 B spill; "
                                                                   "unmeasured")],
    "other": [dict(BLOCK_V=1024, num_warps=4, num_stages=1)],
}
BLOCK_T = 128  # tiles combined per step by the draw


@triton.jit
def _accept_kernel(
    tokens_ptr, q_ptr, p_ptr, vlen_ptr, ua_ptr, num_acc_ptr, outcome_ptr, committed_ptr, state_ptr,
    gamma, eos, stride_tr, stride_qr, stride_qk, stride_pr, stride_pk, stride_ur, stride_or, stride_cr,
    HAS_EOS: tl.constexpr, ACC: tl.constexpr,
):
    """Acceptance walk of request ``program_id(0)``; ``state[r] = (n, rejected, ended)``."""
    r = tl.program_id(0).to(tl.int64)
    verify_len = tl.load(vlen_ptr + r).to(tl.int32)
    n = tl.full([], 0, tl.int32)
    alive = tl.full([], 1, tl.int32)
    ended = tl.full([], 0, tl.int32)
    for k in range(gamma):
        tok = tl.load(tokens_ptr + r * stride_tr + k).to(tl.int64)
        q = tl.load(q_ptr + r * stride_qr + k * stride_qk + tok).to(ACC)
        p = tl.load(p_ptr + r * stride_pr + k * stride_pk + tok).to(ACC)
        u = tl.load(ua_ptr + r * stride_ur + k).to(ACC)
        in_range = (k < verify_len).to(tl.int32)
        passed = (u * q < p).to(tl.int32) * in_range
        accepted = alive * passed
        outcome = tl.where(accepted == 1, 1, tl.where(alive * in_range == 1, 0, -1))
        tl.store(outcome_ptr + r * stride_or + k, outcome.to(tl.int8))
        tl.store(committed_ptr + r * stride_cr + k, tl.where(accepted == 1, tok, -1))
        n += accepted
        if HAS_EOS:
            hit = accepted * (tok == eos).to(tl.int32)
            ended = ended | hit
            accepted = accepted * (1 - hit)
        alive = accepted
    tl.store(committed_ptr + r * stride_cr + gamma, -1)
    tl.store(num_acc_ptr + r, n.to(tl.int64))
    tl.store(state_ptr + r * 3, n.to(tl.int64))
    tl.store(state_ptr + r * 3 + 1, ((n < verify_len) & (ended == 0)).to(tl.int64))
    tl.store(state_ptr + r * 3 + 2, ended.to(tl.int64))


@triton.jit
def _final_row(p_ptr, q_ptr, state_ptr, r, offs, mask, gamma, stride_pr, stride_pk, stride_qr, stride_qk,
               ACC: tl.constexpr):
    """A tile of ``p_n`` and of the residual ``max(0, p_n − q_{n+1})`` of request r."""
    n = tl.load(state_ptr + r * 3)
    p = tl.load(p_ptr + r * stride_pr + n * stride_pk + offs, mask=mask, other=0.0).to(ACC)
    q = tl.load(q_ptr + r * stride_qr + tl.minimum(n, gamma - 1) * stride_qk + offs, mask=mask, other=0.0).to(ACC)
    return p, tl.maximum(p - q, 0.0)


@triton.jit
def _mass_kernel(
    q_ptr, p_ptr, state_ptr, mass_ptr, last_ptr, gamma, vocab, num_tiles,
    stride_pr, stride_pk, stride_qr, stride_qk,
    BLOCK_V: tl.constexpr, ACC: tl.constexpr,
):
    """``mass[r, 0|1, tile]``: fixed-point masses of ``p_n`` and of the residual; ``last``: their last index of
    positive mass."""
    tile = tl.program_id(0)
    r = tl.program_id(1).to(tl.int64)
    offs = tile * BLOCK_V + tl.arange(0, BLOCK_V)
    mask = offs < vocab
    p, residual = _final_row(p_ptr, q_ptr, state_ptr, r, offs, mask, gamma, stride_pr, stride_pk, stride_qr,
                             stride_qk, ACC)
    target_mass, target_last = tile_mass(fixed_point(p), offs, mask)
    residual_mass, residual_last = tile_mass(fixed_point(residual), offs, mask)
    cell = r * 2 * num_tiles + tile
    tl.store(mass_ptr + cell, target_mass)
    tl.store(last_ptr + cell, target_last)
    tl.store(mass_ptr + cell + num_tiles, residual_mass)
    tl.store(last_ptr + cell + num_tiles, residual_last)


@triton.jit
def _draw_kernel(
    q_ptr, p_ptr, state_ptr, mass_ptr, last_ptr, uf_ptr,
    next_ptr, committed_ptr, num_committed_ptr, finished_ptr,
    gamma, vocab, eos, num_tiles, stride_pr, stride_pk, stride_qr, stride_qk, stride_cr,
    HAS_EOS: tl.constexpr, RESIDUAL_EPS_FIXED: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_V: tl.constexpr,
    ACC: tl.constexpr,
):
    """Correction or bonus token of request ``program_id(0)`` (−1 after an accepted EOS)."""
    r = tl.program_id(0).to(tl.int64)
    n = tl.load(state_ptr + r * 3)
    rejected = tl.load(state_ptr + r * 3 + 1)
    ended = tl.load(state_ptr + r * 3 + 2)
    residual_total = tl.full([], 0, tl.int64)
    target_total = tl.full([], 0, tl.int64)
    for t0 in range(0, num_tiles, BLOCK_T):
        offs = t0 + tl.arange(0, BLOCK_T)
        mask = offs < num_tiles
        target_total += tl.sum(tl.load(mass_ptr + r * 2 * num_tiles + offs, mask=mask, other=0), 0)
        residual_total += tl.sum(tl.load(mass_ptr + (r * 2 + 1) * num_tiles + offs, mask=mask, other=0), 0)
    use_residual = (rejected == 1) & (residual_total > RESIDUAL_EPS_FIXED)
    which = use_residual.to(tl.int64)
    total = tl.where(use_residual, residual_total, target_total)
    threshold = draw_threshold(tl.load(uf_ptr + r), total)
    tile, before, last = find_tile(mass_ptr + (r * 2 + which) * num_tiles, last_ptr + (r * 2 + which) * num_tiles,
                                   num_tiles, threshold, BLOCK_T)
    offs = tile * BLOCK_V + tl.arange(0, BLOCK_V)
    mask = offs < vocab
    p, residual = _final_row(p_ptr, q_ptr, state_ptr, r, offs, mask, gamma, stride_pr, stride_pk, stride_qr,
                             stride_qk, ACC)
    w = fixed_point(tl.where(use_residual, residual, p))
    token = tl.minimum(tile * BLOCK_V + draw_in_tile(w, mask, before, threshold), last)
    token = tl.where(ended == 1, -1, token)
    if ended == 0:
        tl.store(committed_ptr + r * stride_cr + n, token)
    finished = ended == 1
    if HAS_EOS:
        finished = finished | (token == eos)
    tl.store(next_ptr + r, token)
    tl.store(num_committed_ptr + r, n + 1 - ended)
    tl.store(finished_ptr + r, finished.to(tl.int8))


def verify(draft_tokens, draft_probs, target_probs, verify_len, accept_uniforms, final_uniforms, *, eos_token_id=None):
    """Triton launcher with the signature of ``dspark.verify.verify`` (inputs validated there)."""
    num_requests, gamma, vocab = draft_probs.shape
    device = draft_probs.device
    draft_tokens, draft_probs = draft_tokens.contiguous(), draft_probs.contiguous()
    target_probs, accept_uniforms = target_probs.contiguous(), accept_uniforms.contiguous()
    num_accepted = empty_output(num_requests, dtype=torch.long, device=device)
    outcome = empty_output(num_requests, gamma, dtype=torch.int8, device=device)
    next_token = empty_output(num_requests, dtype=torch.long, device=device)
    committed = empty_output(num_requests, gamma + 1, dtype=torch.long, device=device)
    num_committed = empty_output(num_requests, dtype=torch.long, device=device)
    finished = empty_output(num_requests, dtype=torch.int8, device=device)
    if num_requests:
        # The mass and draw kernels must agree on the vocabulary tiling: both take the same (first) config.
        config = select_config("verify", device, CONFIGS, lambda c: True, (vocab,))
        num_tiles = triton.cdiv(vocab, config["BLOCK_V"])
        acc = accumulator(draft_probs.dtype)
        eos = -1 if eos_token_id is None else int(eos_token_id)
        state = torch.empty(num_requests, 3, dtype=torch.long, device=device)
        mass = torch.empty(num_requests, 2, num_tiles, dtype=torch.long, device=device)
        last = torch.empty_like(mass)
        p_strides = (target_probs.stride(0), target_probs.stride(1), draft_probs.stride(0), draft_probs.stride(1))
        launch("verify_accept", _accept_kernel, (num_requests,),
               (draft_tokens, draft_probs, target_probs, verify_len.contiguous(), accept_uniforms,
                num_accepted, outcome, committed, state, gamma, eos,
                draft_tokens.stride(0), draft_probs.stride(0), draft_probs.stride(1), target_probs.stride(0),
                target_probs.stride(1), accept_uniforms.stride(0), outcome.stride(0), committed.stride(0)),
               dict(HAS_EOS=eos_token_id is not None, ACC=acc),
               device=device, table={"other": [dict(num_warps=1, num_stages=1)]}, key=(vocab,), tunable=False)
        launch("verify_mass", _mass_kernel, (num_tiles, num_requests),
               (draft_probs, target_probs, state, mass, last, gamma, vocab, num_tiles, *p_strides),
               dict(ACC=acc), device=device, table=CONFIGS, key=(vocab,), tunable=False, config=config)
        launch("verify_draw", _draw_kernel, (num_requests,),
               (draft_probs, target_probs, state, mass, last, final_uniforms.contiguous(),
                next_token, committed, num_committed, finished, gamma, vocab, eos, num_tiles, *p_strides,
                committed.stride(0)),
               dict(HAS_EOS=eos_token_id is not None, RESIDUAL_EPS_FIXED=RESIDUAL_EPS_FIXED, BLOCK_T=BLOCK_T,
                    ACC=acc),
               device=device, table=CONFIGS, key=(vocab,), tunable=False, config=config)
    return VerifyOutput(num_accepted, outcome, next_token, committed, num_committed, finished.bool())

