"""Fused rejection sampler: ragged batched verification with residual and bonus sampling.

Mirrors ``dspark.reference.verify.verify``. One program per request: the acceptance tests walk the γ
slots reading one probability of each distribution; then one vocabulary row (the residual
``max(0, p_n − q_{n+1})`` or the target row ``p_n``) is streamed twice, once for its mass and once for
the inverse-CDF draw.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from dspark.kernels._sampling import inverse_cdf_tile
from dspark.kernels._tuning import accumulator, empty_output, launch

from dspark.verify import RESIDUAL_EPS, VerifyOutput

CONFIGS = {
    "interpreter": [dict(BLOCK_V=16, num_warps=1, num_stages=1)],
    "sm90": [dict(BLOCK_V=2048, num_warps=8, num_stages=2), dict(BLOCK_V=1024, num_warps=4, num_stages=2)],
    "sm100": [dict(BLOCK_V=4096, num_warps=8, num_stages=2,
                   label="compiled sm_100/sm_103 (Triton 3.9, paper shapes): 128 regs, 0 B spill; never run"),
              dict(BLOCK_V=2048, num_warps=8, num_stages=2,
                   label="compiled sm_100/sm_103 (Triton 3.9, paper shapes): 80 regs, 0 B spill; never run")],
    "other": [dict(BLOCK_V=1024, num_warps=4, num_stages=1)],
}


@triton.jit
def _verify_kernel(
    tokens_ptr, q_ptr, p_ptr, vlen_ptr, ua_ptr, uf_ptr,
    num_acc_ptr, outcome_ptr, next_ptr, committed_ptr, num_committed_ptr, finished_ptr,
    gamma, vocab, eos,
    stride_tr, stride_qr, stride_qk, stride_pr, stride_pk, stride_ur, stride_or, stride_cr,
    HAS_EOS: tl.constexpr, RESIDUAL_EPS: tl.constexpr, BLOCK_V: tl.constexpr, ACC: tl.constexpr,
):
    """Mirrors ``dspark.reference.verify.verify`` for request ``program_id(0)``."""
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
    rejected = (n < verify_len) & (ended == 0)
    reject_slot = tl.minimum(n, gamma - 1).to(tl.int64)
    p_row = p_ptr + r * stride_pr + n.to(tl.int64) * stride_pk
    q_row = q_ptr + r * stride_qr + reject_slot * stride_qk
    target_mass = tl.zeros([BLOCK_V], ACC)
    residual_mass = tl.zeros([BLOCK_V], ACC)
    for v0 in range(0, vocab, BLOCK_V):
        offs = v0 + tl.arange(0, BLOCK_V)
        mask = offs < vocab
        p = tl.load(p_row + offs, mask=mask, other=0.0).to(ACC)
        q = tl.load(q_row + offs, mask=mask, other=0.0).to(ACC)
        target_mass += p
        residual_mass += tl.maximum(p - q, 0.0)
    residual_total = tl.sum(residual_mass, 0)
    use_residual = rejected & (residual_total > RESIDUAL_EPS)
    total = tl.where(use_residual, residual_total, tl.sum(target_mass, 0))
    threshold = tl.load(uf_ptr + r).to(ACC) * total
    carry = tl.full([], 0.0, ACC)
    below = tl.full([], 0, tl.int64)
    last_positive = tl.full([], 0, tl.int64)
    for v0 in range(0, vocab, BLOCK_V):
        offs = v0 + tl.arange(0, BLOCK_V)
        mask = offs < vocab
        p = tl.load(p_row + offs, mask=mask, other=0.0).to(ACC)
        q = tl.load(q_row + offs, mask=mask, other=0.0).to(ACC)
        x = tl.where(use_residual, tl.maximum(p - q, 0.0), p)
        carry, below, last_positive = inverse_cdf_tile(x, offs, mask, carry, threshold, below, last_positive)
    token = tl.minimum(below, last_positive)
    token = tl.where(ended == 1, -1, token)
    if ended == 0:
        tl.store(committed_ptr + r * stride_cr + n, token)
    finished = ended == 1
    if HAS_EOS:
        finished = finished | (token == eos)
    tl.store(next_ptr + r, token)
    tl.store(num_acc_ptr + r, n.to(tl.int64))
    tl.store(num_committed_ptr + r, (n + 1 - ended).to(tl.int64))
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
        args = (
            draft_tokens, draft_probs, target_probs, verify_len.contiguous(), accept_uniforms,
            final_uniforms.contiguous(),
            num_accepted, outcome, next_token, committed, num_committed, finished,
            gamma, vocab, -1 if eos_token_id is None else int(eos_token_id),
            draft_tokens.stride(0), draft_probs.stride(0), draft_probs.stride(1), target_probs.stride(0),
            target_probs.stride(1), accept_uniforms.stride(0), outcome.stride(0), committed.stride(0),
        )
        constexprs = dict(HAS_EOS=eos_token_id is not None, RESIDUAL_EPS=RESIDUAL_EPS,
                          ACC=accumulator(draft_probs.dtype))
        launch("verify", _verify_kernel, (num_requests,), args, constexprs, device=device, table=CONFIGS,
               key=(vocab,))
    return VerifyOutput(num_accepted, outcome, next_token, committed, num_committed, finished.bool())
