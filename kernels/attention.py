"""Flash-style block attention with KV injection: online softmax over [visible context | own block].

Mirrors ``dspark.reference.attention.block_attention``. One program per (block, kv head) holds the γ
query slots of all the query heads that share that kv head (GQA), so each context tile is loaded once
per group: rows ``slot · G + g``. It streams the context rows ``j < ctx_len`` in tiles, then the block's
own γ keys, keeping a running max and sum; padding blocks write zeros. The training layout (many blocks
over one context) and the inference layout (one block per request over its cache) are the same launch.

Operands: bf16/fp16 inputs go into ``tl.dot`` as they are (tensor cores: wgmma on Hopper, tcgen05 on
Blackwell) with fp32 accumulation, and the softmax weights are rounded to the input dtype for the PV
product, as flash attention does; fp32 inputs run IEEE fp32 products (no TF32) and fp64 inputs fp64 ones,
so those two match the oracle to their own rounding.

Forward only: the backward pass recomputes the attention with the PyTorch implementation and
differentiates that (``BlockAttentionFunction``), which is exact but not fused.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from dspark.kernels._tuning import (
    accumulator,
    empty_output,
    interpreting,
    launch,
    next_power_of_2,
    shared_memory_bytes,
)

CONFIGS = {
    "interpreter": [dict(BLOCK_N=8, num_warps=1, num_stages=1)],
    "sm90": [dict(BLOCK_N=64, num_warps=8, num_stages=3), dict(BLOCK_N=64, num_warps=4, num_stages=3),
             dict(BLOCK_N=32, num_warps=4, num_stages=3), dict(BLOCK_N=128, num_warps=8, num_stages=3),
             dict(BLOCK_N=64, num_warps=4, num_stages=2), dict(BLOCK_N=32, num_warps=4, num_stages=2)],
    # Blackwell: of the tiles compiled for sm_100/sm_103 at the paper's decode shape (compile_matrix.py), only
    # BLOCK_N = 16 without pipelining stays under 255 registers with no spill; every pipelined or wider tile
    # spilled 8-1300 B (we think from their [BLOCK_N, head_dim] tensors of 64-bit K and V addresses;
    # block pointers, which would avoid them, are gone from Triton 3.9), so none is listed.
    "sm100": [dict(BLOCK_N=16, num_warps=8, num_stages=1,
                   label="compiled sm_100/sm_103 (Triton 3.9, paper decode shape): 252 regs, 0 B spill, 24 KiB smem, "
                         "tcgen05; never run")],
    "other": [dict(BLOCK_N=32, num_warps=4, num_stages=2)],
}


@triton.jit
def _online_update(q, keys, values, valid, run_max, run_sum, acc, scale, ACC: tl.constexpr, PRECISION: tl.constexpr):
    scores = tl.dot(q, tl.trans(keys), input_precision=PRECISION, out_dtype=ACC) * scale
    scores = tl.where(valid, scores, float("-inf"))
    new_max = tl.maximum(run_max, tl.max(scores, 1))
    # Rows whose every key so far is masked keep max -inf; shift by 0 there to avoid inf - inf.
    shift = tl.where(new_max == float("-inf"), 0.0, new_max)
    p = tl.exp(scores - shift[:, None])
    alpha = tl.exp(tl.where(run_max == float("-inf"), float("-inf"), run_max - shift))
    run_sum = run_sum * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(values.dtype), values, input_precision=PRECISION, out_dtype=ACC)
    return new_max, run_sum, acc


@triton.jit
def _block_attention_kernel(
    q_ptr, kc_ptr, vc_ptr, kb_ptr, vb_ptr, ctx_len_ptr, valid_ptr, scale_ptr, out_ptr,
    num_blocks, gamma, group, head_dim,
    sq_b, sq_n, sq_k, sq_h,
    skc_b, skc_s, skc_h,
    skb_b, skb_n, skb_k, skb_h,
    so_b, so_n, so_k, so_h,
    BLOCK_M: tl.constexpr, BLOCK_J: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    ACC: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
):
    """Mirrors ``dspark.reference.attention.block_attention`` for one (block, kv head)."""
    pid = tl.program_id(0).to(tl.int64)
    kv = tl.program_id(1).to(tl.int64)
    b = pid // num_blocks
    n = pid % num_blocks
    rows = tl.arange(0, BLOCK_M)
    slot = rows // group
    head = kv * group + rows % group
    row_mask = rows < gamma * group
    dims = tl.arange(0, BLOCK_D)
    dim_mask = dims < head_dim
    q_off = b * sq_b + n * sq_n + slot[:, None] * sq_k + head[:, None] * sq_h + dims[None, :]
    q = tl.load(q_ptr + q_off, mask=row_mask[:, None] & dim_mask[None, :], other=0.0)
    if UPCAST:
        q = q.to(ACC)
    scale = tl.load(scale_ptr).to(ACC)
    ctx_len = tl.load(ctx_len_ptr + pid)
    valid = tl.load(valid_ptr + pid) != 0

    run_max = tl.full([BLOCK_M], float("-inf"), ACC)
    run_sum = tl.zeros([BLOCK_M], ACC)
    acc = tl.zeros([BLOCK_M, BLOCK_D], ACC)
    kc_base = kc_ptr + b * skc_b + kv * skc_h
    vc_base = vc_ptr + b * skc_b + kv * skc_h
    for s0 in range(0, ctx_len, BLOCK_N):
        cols = s0 + tl.arange(0, BLOCK_N)
        col_mask = cols < ctx_len
        kv_off = cols[:, None] * skc_s + dims[None, :]
        tile_mask = col_mask[:, None] & dim_mask[None, :]
        keys = tl.load(kc_base + kv_off, mask=tile_mask, other=0.0)
        values = tl.load(vc_base + kv_off, mask=tile_mask, other=0.0)
        if UPCAST:
            keys, values = keys.to(ACC), values.to(ACC)
        run_max, run_sum, acc = _online_update(q, keys, values, col_mask[None, :], run_max, run_sum, acc, scale,
                                               ACC, PRECISION)

    js = tl.arange(0, BLOCK_J)
    j_mask = js < gamma
    kb_off = b * skb_b + n * skb_n + kv * skb_h + js[:, None] * skb_k + dims[None, :]
    tile_mask = j_mask[:, None] & dim_mask[None, :]
    keys = tl.load(kb_ptr + kb_off, mask=tile_mask, other=0.0)
    values = tl.load(vb_ptr + kb_off, mask=tile_mask, other=0.0)
    if UPCAST:
        keys, values = keys.to(ACC), values.to(ACC)
    run_max, run_sum, acc = _online_update(q, keys, values, j_mask[None, :], run_max, run_sum, acc, scale,
                                           ACC, PRECISION)

    out = acc / tl.where(run_sum > 0, run_sum, 1.0)[:, None]
    out = tl.where(valid, out, 0.0)
    o_off = b * so_b + n * so_n + slot[:, None] * so_k + head[:, None] * so_h + dims[None, :]
    tl.store(out_ptr + o_off, out.to(out_ptr.dtype.element_ty), mask=row_mask[:, None] & dim_mask[None, :])


def _forward(q, k_ctx, v_ctx, k_blk, v_blk, ctx_len, block_valid, scale):
    batch, num_blocks, gamma, num_heads, head_dim = q.shape
    num_kv = k_ctx.shape[2]
    group = num_heads // num_kv
    q, k_blk, v_blk = q.contiguous(), k_blk.contiguous(), v_blk.contiguous()
    k_ctx, v_ctx = k_ctx.contiguous(), v_ctx.contiguous()
    out = empty_output(*q.shape, dtype=q.dtype, device=q.device)
    if q.numel() == 0:
        return out
    acc_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    scale_t = torch.tensor([scale], dtype=acc_dtype, device=q.device)
    # The interpreter computes bf16/fp16 arithmetic on raw bits, so there half-precision tiles are upcast
    # after loading (the same kernel, its fp32 path); a GPU feeds them to the tensor cores as they are.
    upcast = q.dtype in (torch.float32, torch.float64) or interpreting()
    elem = 4 if upcast else q.element_size()
    # Rows are (slot, query head) pairs of one KV group. Tensor-core MMAs on Hopper and Blackwell (wgmma,
    # tcgen05) take 64 rows at least, so half-precision tiles are padded to 64; padding rows are masked.
    block_m = max(16 if upcast else 64, next_power_of_2(gamma * group))
    block_d = max(16, next_power_of_2(head_dim))
    smem = shared_memory_bytes(q.device)

    def fits(c):
        # Pipelined K/V tiles (num_stages copies) plus the dot operands' staging buffers. Triton 3.6 asked
        # 272 KiB for fp32, BLOCK_N=64, 3 stages, head_dim 128 on an H200 (227 KiB); this bound gives 288.
        staged = c["num_stages"] * 2 * c["BLOCK_N"] * block_d * elem
        operands = 2 * (block_m + c["BLOCK_N"]) * block_d * elem
        return staged + operands <= smem

    args = (
        q, k_ctx, v_ctx, k_blk, v_blk, ctx_len.contiguous(), block_valid.to(torch.int8).contiguous(), scale_t, out,
        num_blocks, gamma, group, head_dim,
        q.stride(0), q.stride(1), q.stride(2), q.stride(3),
        k_ctx.stride(0), k_ctx.stride(1), k_ctx.stride(2),
        k_blk.stride(0), k_blk.stride(1), k_blk.stride(2), k_blk.stride(3),
        out.stride(0), out.stride(1), out.stride(2), out.stride(3),
    )
    constexprs = dict(
        BLOCK_M=block_m, BLOCK_J=max(16, next_power_of_2(gamma)), BLOCK_D=block_d, ACC=accumulator(q.dtype),
        # fp32 operands must not drop to TF32 (1e-3 error); fp64 and half-precision operands take the default
        # path (fp64 products; tensor cores for bf16/fp16).
        PRECISION="ieee" if q.dtype == torch.float32 or (upcast and q.dtype != torch.float64) else None,
        UPCAST=upcast,
    )
    launch("block_attention", _block_attention_kernel, (batch * num_blocks, num_kv), args, constexprs,
           device=q.device, table=CONFIGS, key=(gamma * group, head_dim), fits=fits)
    return out


class BlockAttentionFunction(torch.autograd.Function):
    """Triton forward; backward by differentiating the PyTorch implementation on the saved inputs."""

    @staticmethod
    def forward(ctx, q, k_ctx, v_ctx, k_blk, v_blk, ctx_len, block_valid, scale):
        ctx.save_for_backward(q, k_ctx, v_ctx, k_blk, v_blk, ctx_len, block_valid)
        ctx.scale = scale
        return _forward(q, k_ctx, v_ctx, k_blk, v_blk, ctx_len, block_valid, scale)

    @staticmethod
    def backward(ctx, grad_out):
        from dspark.attention import _block_attention_torch

        q, k_ctx, v_ctx, k_blk, v_blk, ctx_len, block_valid = ctx.saved_tensors
        inputs = [t.detach().requires_grad_(t.requires_grad) for t in (q, k_ctx, v_ctx, k_blk, v_blk)]
        with torch.enable_grad():
            out = _block_attention_torch(*inputs, ctx_len, block_valid, ctx.scale)
            wanted = [t for t in inputs if t.requires_grad]
            grads = iter(torch.autograd.grad(out, wanted, grad_out))
        return (*[next(grads) if t.requires_grad else None for t in inputs], None, None, None)


def block_attention(q, k_ctx, v_ctx, k_blk, v_blk, ctx_len, block_valid, scale):
    """Triton launcher with the signature of ``dspark.attention.block_attention`` (inputs validated there)."""
    return BlockAttentionFunction.apply(q, k_ctx, v_ctx, k_blk, v_blk, ctx_len, block_valid, scale)
