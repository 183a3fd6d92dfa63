"""Flash-style block attention with KV injection: online softmax over [visible context | own block].

Mirrors ``dspark.reference.attention.block_attention``. One program per (block, kv head) holds the γ
query slots of all the query heads that share that kv head (GQA), so each context tile is loaded once
per group: rows ``slot · G + g``. It streams the context rows ``j < ctx_len`` in tiles, then the block's
own γ keys, keeping a running max and sum; padding blocks write zeros. The training layout (many blocks
over one context) and the inference layout (one block per request over its cache) are the same launch.
When few (block, kv head) programs are in flight, as in decode at small batch over a long cache, each
block's context is split among several programs whose partial softmax states are merged afterwards.

Operands: bf16/fp16 inputs go into ``tl.dot`` as they are (tensor cores: wgmma on Hopper, tcgen05 on
Blackwell) with fp32 accumulation, and the softmax weights are rounded to the input dtype for the PV
product, as flash attention does; fp32 inputs run IEEE fp32 products (no TF32) and fp64 inputs fp64 ones,
so those two match the oracle to their own rounding.

Backward (flash-attention 2's recipe): the forward also stores each row's log-sum-exp, and two kernels
recompute the probabilities tile by tile from it, with ``Δ = rowsum(dO ∘ O)``:

* one program per (block, kv head) walks the same tiles as the forward and produces dQ, and the gradients
  of the block's own keys and values (only that block's queries read them);
* one program per (sequence, kv head, context tile) walks the blocks that see its tile and accumulates that
  tile's dK and dV, so context gradients, which many blocks share in training, need no atomics and are
  deterministic.

With ``P = exp(S − lse)`` and ``dS = P ∘ (dO·Vᵀ − Δ)``: ``dQ = scale·dS·K``, ``dK = scale·dSᵀ·Q``,
``dV = Pᵀ·dO``. Half-precision operands go into the products as they are (P and dS rounded to the input
dtype first), with fp32 accumulation.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl
from dspark.kernels._tuning import (
    accumulator,
    empty_output,
    empty_output_like,
    interpreting,
    launch,
    next_power_of_2,
    planned,
    select_config,
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
                         "tcgen05; unmeasured")],
    "other": [dict(BLOCK_N=32, num_warps=4, num_stages=2)],
}


@triton.jit
def _kv_tiles(k_ptr, v_ptr, offsets, mask, ACC: tl.constexpr, UPCAST: tl.constexpr):
    """A tile of keys and the matching values (zeros where masked), upcast after loading under ``UPCAST``."""
    keys = tl.load(k_ptr + offsets, mask=mask, other=0.0)
    values = tl.load(v_ptr + offsets, mask=mask, other=0.0)
    if UPCAST:
        keys, values = keys.to(ACC), values.to(ACC)
    return keys, values


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
    q_ptr, kc_ptr, vc_ptr, kb_ptr, vb_ptr, ctx_len_ptr, valid_ptr, scale_ptr, out_ptr, lse_ptr, out_acc_ptr,
    part_ptr, part_stat_ptr,
    num_blocks, gamma, group, head_dim, split_len,
    sq_b, sq_n, sq_k, sq_h,
    skc_b, skc_s, skc_h,
    skb_b, skb_n, skb_k, skb_h,
    so_b, so_n, so_k, so_h,
    BLOCK_M: tl.constexpr, BLOCK_J: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    ACC: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr, STORE_LSE: tl.constexpr,
    SPLIT: tl.constexpr,
):
    """Mirrors ``dspark.reference.attention.block_attention`` for one (block, kv head, context split).

    Split ``s`` (grid axis 2) reads context rows ``[s·split_len, (s+1)·split_len)`` below ``ctx_len``, and the
    last split also the block's own keys. With ``SPLIT`` each split writes its unnormalised partial output
    and its running max and sum for :func:`_combine_splits`; otherwise (one split) the output itself, and with
    ``STORE_LSE`` also, for the backward pass, each row's log-sum-exp of scaled scores (``[B, N, γ, Hq]``)
    and the output before its rounding to the input dtype."""
    pid = tl.program_id(0).to(tl.int64)
    kv = tl.program_id(1).to(tl.int64)
    split = tl.program_id(2)
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
    lo = split * split_len
    hi = tl.minimum(lo + split_len, ctx_len)
    for s0 in range(lo, hi, BLOCK_N):
        cols = s0 + tl.arange(0, BLOCK_N)
        col_mask = cols < hi
        kv_off = cols[:, None] * skc_s + dims[None, :]
        tile_mask = col_mask[:, None] & dim_mask[None, :]
        keys, values = _kv_tiles(kc_base, vc_base, kv_off, tile_mask, ACC, UPCAST)
        run_max, run_sum, acc = _online_update(q, keys, values, col_mask[None, :], run_max, run_sum, acc, scale,
                                               ACC, PRECISION)

    if split == tl.num_programs(2) - 1:
        js = tl.arange(0, BLOCK_J)
        j_mask = js < gamma
        kb_off = b * skb_b + n * skb_n + kv * skb_h + js[:, None] * skb_k + dims[None, :]
        tile_mask = j_mask[:, None] & dim_mask[None, :]
        keys, values = _kv_tiles(kb_ptr, vb_ptr, kb_off, tile_mask, ACC, UPCAST)
        run_max, run_sum, acc = _online_update(q, keys, values, j_mask[None, :], run_max, run_sum, acc, scale,
                                               ACC, PRECISION)

    num_heads = group * tl.num_programs(1)
    if SPLIT:
        row = (split * tl.num_programs(0) + pid) * gamma * num_heads + slot * num_heads + head
        tl.store(part_ptr + row[:, None] * head_dim + dims[None, :], acc, mask=row_mask[:, None] & dim_mask[None, :])
        tl.store(part_stat_ptr + 2 * row, run_max, mask=row_mask)
        tl.store(part_stat_ptr + 2 * row + 1, run_sum, mask=row_mask)
    else:
        out = acc / tl.where(run_sum > 0, run_sum, 1.0)[:, None]
        out = tl.where(valid, out, 0.0)
        o_off = b * so_b + n * so_n + slot[:, None] * so_k + head[:, None] * so_h + dims[None, :]
        tl.store(out_ptr + o_off, out.to(out_ptr.dtype.element_ty), mask=row_mask[:, None] & dim_mask[None, :])
        if STORE_LSE:
            tl.store(out_acc_ptr + o_off, out, mask=row_mask[:, None] & dim_mask[None, :])
            # Every row sees its own block's γ ≥ 1 keys, so its sum is positive and the log finite.
            tl.store(lse_ptr + pid * gamma * num_heads + slot * num_heads + head, run_max + tl.log(run_sum),
                     mask=row_mask)


@triton.jit
def _row_tiles(q_ptr, do_ptr, lse_ptr, delta_ptr, blk, kv, gamma, group, head_dim,
               sq_b, sq_n, sq_k, sq_h, num_blocks,
               BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, ACC: tl.constexpr, UPCAST: tl.constexpr):
    """The query and output-gradient rows (slot, query head) of block ``blk`` and kv head ``kv``, with their
    log-sum-exp and Δ; rows past γ·G are masked (``row_mask``)."""
    b = blk // num_blocks
    n = blk % num_blocks
    rows = tl.arange(0, BLOCK_M)
    slot = rows // group
    head = kv * group + rows % group
    row_mask = rows < gamma * group
    dims = tl.arange(0, BLOCK_D)
    tile_mask = row_mask[:, None] & (dims < head_dim)[None, :]
    offs = b * sq_b + n * sq_n + slot[:, None] * sq_k + head[:, None] * sq_h + dims[None, :]
    q = tl.load(q_ptr + offs, mask=tile_mask, other=0.0)
    do = tl.load(do_ptr + offs, mask=tile_mask, other=0.0)
    if UPCAST:
        q, do = q.to(ACC), do.to(ACC)
    num_heads = group * tl.num_programs(1)
    stat = blk * gamma * num_heads + slot * num_heads + head
    lse = tl.load(lse_ptr + stat, mask=row_mask, other=0.0)
    delta = tl.load(delta_ptr + stat, mask=row_mask, other=0.0)
    return q, do, lse, delta, row_mask, offs, tile_mask


@triton.jit
def _score_grads(q, do, keys, values, lse, delta, visible, scale, ACC: tl.constexpr, PRECISION: tl.constexpr):
    """P = exp(S − lse) and dS = P ∘ (dO·Vᵀ − Δ) of one tile, zero where not ``visible``."""
    scores = tl.dot(q, tl.trans(keys), input_precision=PRECISION, out_dtype=ACC) * scale
    p = tl.where(visible, tl.exp(scores - lse[:, None]), 0.0)
    dp = tl.dot(do, tl.trans(values), input_precision=PRECISION, out_dtype=ACC)
    return p, p * (dp - delta[:, None])


@triton.jit
def _block_attention_bwd_query_kernel(
    q_ptr, kc_ptr, vc_ptr, kb_ptr, vb_ptr, do_ptr, lse_ptr, delta_ptr, ctx_len_ptr, valid_ptr, scale_ptr,
    dq_ptr, dkb_ptr, dvb_ptr,
    num_blocks, gamma, group, head_dim,
    sq_b, sq_n, sq_k, sq_h,
    skc_b, skc_s, skc_h,
    skb_b, skb_n, skb_k, skb_h,
    BLOCK_M: tl.constexpr, BLOCK_J: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    ACC: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
):
    """dQ of one (block, kv head), and the gradients of that block's own keys and values."""
    pid = tl.program_id(0).to(tl.int64)
    kv = tl.program_id(1).to(tl.int64)
    b = pid // num_blocks
    n = pid % num_blocks
    q, do, lse, delta, row_mask, q_off, q_mask = _row_tiles(
        q_ptr, do_ptr, lse_ptr, delta_ptr, pid, kv, gamma, group, head_dim, sq_b, sq_n, sq_k, sq_h, num_blocks,
        BLOCK_M, BLOCK_D, ACC, UPCAST)
    # A padding block's output is a constant zero: nothing flows back through it.
    live = row_mask & (tl.load(valid_ptr + pid) != 0)
    scale = tl.load(scale_ptr).to(ACC)
    ctx_len = tl.load(ctx_len_ptr + pid)
    dims = tl.arange(0, BLOCK_D)
    dim_mask = dims < head_dim

    dq = tl.zeros([BLOCK_M, BLOCK_D], ACC)
    kc_base = kc_ptr + b * skc_b + kv * skc_h
    vc_base = vc_ptr + b * skc_b + kv * skc_h
    for s0 in range(0, ctx_len, BLOCK_N):
        cols = s0 + tl.arange(0, BLOCK_N)
        col_mask = cols < ctx_len
        kv_off = cols[:, None] * skc_s + dims[None, :]
        tile_mask = col_mask[:, None] & dim_mask[None, :]
        keys, values = _kv_tiles(kc_base, vc_base, kv_off, tile_mask, ACC, UPCAST)
        _, ds = _score_grads(q, do, keys, values, lse, delta, live[:, None] & col_mask[None, :], scale, ACC,
                             PRECISION)
        dq += tl.dot(ds.to(keys.dtype), keys, input_precision=PRECISION, out_dtype=ACC)

    js = tl.arange(0, BLOCK_J)
    j_mask = js < gamma
    kb_off = b * skb_b + n * skb_n + kv * skb_h + js[:, None] * skb_k + dims[None, :]
    tile_mask = j_mask[:, None] & dim_mask[None, :]
    keys, values = _kv_tiles(kb_ptr, vb_ptr, kb_off, tile_mask, ACC, UPCAST)
    p, ds = _score_grads(q, do, keys, values, lse, delta, live[:, None] & j_mask[None, :], scale, ACC, PRECISION)
    dq += tl.dot(ds.to(keys.dtype), keys, input_precision=PRECISION, out_dtype=ACC)
    dv_blk = tl.dot(tl.trans(p.to(do.dtype)), do, input_precision=PRECISION, out_dtype=ACC)
    dk_blk = tl.dot(tl.trans(ds.to(q.dtype)), q, input_precision=PRECISION, out_dtype=ACC) * scale
    tl.store(dq_ptr + q_off, (dq * scale).to(dq_ptr.dtype.element_ty), mask=q_mask)
    tl.store(dkb_ptr + kb_off, dk_blk.to(dkb_ptr.dtype.element_ty), mask=tile_mask)
    tl.store(dvb_ptr + kb_off, dv_blk.to(dvb_ptr.dtype.element_ty), mask=tile_mask)


@triton.jit
def _block_attention_bwd_context_kernel(
    q_ptr, kc_ptr, vc_ptr, do_ptr, lse_ptr, delta_ptr, ctx_len_ptr, valid_ptr, scale_ptr,
    dkc_ptr, dvc_ptr,
    num_blocks, gamma, group, head_dim, context,
    sq_b, sq_n, sq_k, sq_h,
    skc_b, skc_s, skc_h,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    ACC: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
):
    """dK and dV of one tile of one sequence's context rows for one kv head, summed over the blocks that see it."""
    pid = tl.program_id(0).to(tl.int64)
    kv = tl.program_id(1).to(tl.int64)
    num_tiles = tl.cdiv(context, BLOCK_N)
    b = pid // num_tiles
    start = (pid % num_tiles) * BLOCK_N
    cols = start + tl.arange(0, BLOCK_N)
    dims = tl.arange(0, BLOCK_D)
    tile_mask = (cols < context)[:, None] & (dims < head_dim)[None, :]
    kv_off = b * skc_b + kv * skc_h + cols[:, None] * skc_s + dims[None, :]
    keys, values = _kv_tiles(kc_ptr, vc_ptr, kv_off, tile_mask, ACC, UPCAST)
    scale = tl.load(scale_ptr).to(ACC)
    dk = tl.zeros([BLOCK_N, BLOCK_D], ACC)
    dv = tl.zeros([BLOCK_N, BLOCK_D], ACC)
    for n in range(0, num_blocks):
        blk = b * num_blocks + n
        ctx_len = tl.load(ctx_len_ptr + blk)
        if (tl.load(valid_ptr + blk) != 0) & (ctx_len > start):
            q, do, lse, delta, row_mask, _, _ = _row_tiles(
                q_ptr, do_ptr, lse_ptr, delta_ptr, blk, kv, gamma, group, head_dim, sq_b, sq_n, sq_k, sq_h,
                num_blocks, BLOCK_M, BLOCK_D, ACC, UPCAST)
            visible = row_mask[:, None] & (cols < ctx_len)[None, :]
            p, ds = _score_grads(q, do, keys, values, lse, delta, visible, scale, ACC, PRECISION)
            dv += tl.dot(tl.trans(p.to(do.dtype)), do, input_precision=PRECISION, out_dtype=ACC)
            dk += tl.dot(tl.trans(ds.to(q.dtype)), q, input_precision=PRECISION, out_dtype=ACC)
    tl.store(dkc_ptr + kv_off, (dk * scale).to(dkc_ptr.dtype.element_ty), mask=tile_mask)
    tl.store(dvc_ptr + kv_off, dv.to(dvc_ptr.dtype.element_ty), mask=tile_mask)


# Backward tiles: the query-side kernel walks context tiles of BLOCK_N keys as the forward does; the context-side
# kernel owns BLOCK_N context rows and walks the blocks. Both hold Q, dO and fp32 accumulators in registers,
# so at the paper's training shape (compile_matrix.py) only 8 warps avoid spilling: on Hopper BLOCK_N = 64
# for the query side, while every context-side tile compiled spills (16 rows the least, 128 B); on Blackwell
# BLOCK_N = 16 for both.
_TIMED = "timed by autotuning on an H200 (Triton 3.6, 2026-12-04)"
BWD_QUERY_CONFIGS = {
    "interpreter": [dict(BLOCK_N=8, num_warps=1, num_stages=1)],
    "sm90": [dict(BLOCK_N=64, num_warps=8, num_stages=2, label=_TIMED),
             dict(BLOCK_N=64, num_warps=8, num_stages=1, label=_TIMED),
             dict(BLOCK_N=16, num_warps=8, num_stages=1, label=_TIMED)],
    "sm100": [dict(BLOCK_N=16, num_warps=8, num_stages=1,
                   label="compiled sm_100/sm_103 (Triton 3.9, paper training shape): 254 regs, 0 B spill, "
                         "tcgen05; unmeasured")],
    "other": [dict(BLOCK_N=32, num_warps=4, num_stages=1)],
}
BWD_CONTEXT_CONFIGS = {
    "interpreter": [dict(BLOCK_N=8, num_warps=1, num_stages=1)],
    "sm90": [dict(BLOCK_N=16, num_warps=8, num_stages=1, label=_TIMED),
             dict(BLOCK_N=64, num_warps=8, num_stages=2, label=_TIMED)],
    "sm100": [dict(BLOCK_N=16, num_warps=8, num_stages=1,
                   label="compiled sm_100/sm_103 (Triton 3.9, paper training shape): 255 regs, 0 B spill, "
                         "tcgen05; unmeasured")],
    "other": [dict(BLOCK_N=32, num_warps=4, num_stages=1)],
}


def _tiles(q: torch.Tensor, gamma: int, group: int, head_dim: int) -> dict:
    """Tile sizes and arithmetic shared by the forward and backward launches."""
    # The interpreter computes bf16/fp16 arithmetic on raw bits, so there half-precision tiles are upcast
    # after loading (the same kernel, its fp32 path); a GPU feeds them to the tensor cores as they are.
    upcast = q.dtype in (torch.float32, torch.float64) or interpreting()
    # Rows are (slot, query head) pairs of one KV group. Tensor-core MMAs on Hopper and Blackwell (wgmma,
    # tcgen05) take 64 rows at least, so half-precision tiles are padded to 64; padding rows are masked.
    return dict(
        BLOCK_M=max(16 if upcast else 64, next_power_of_2(gamma * group)),
        BLOCK_D=max(16, next_power_of_2(head_dim)), ACC=accumulator(q.dtype),
        # fp32 operands must not drop to TF32 (1e-3 error); fp64 and half-precision operands take the default
        # path (fp64 products; tensor cores for bf16/fp16).
        PRECISION="ieee" if q.dtype == torch.float32 or (upcast and q.dtype != torch.float64) else None,
        UPCAST=upcast,
    )


def _store_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a kernel writes an output of ``dtype`` in: the interpreter's fp32 → bf16 cast truncates where a
    GPU's rounds to nearest, so under it half-precision outputs are written in fp32 and rounded by PyTorch."""
    return torch.float32 if interpreting() and dtype in (torch.bfloat16, torch.float16) else dtype


def _fits(q: torch.Tensor, tiles: dict, tiles_in_flight: int):
    """A shape predicate: pipelined K/V tiles (num_stages copies) plus the dot operands' staging buffers fit in
    shared memory. Triton 3.6 asked 272 KiB for fp32, BLOCK_N=64, 3 stages, head_dim 128 on an H200 (227 KiB);
    this bound gives 288. The backward stages more operands per tile (``tiles_in_flight``)."""
    elem = 4 if tiles["UPCAST"] else q.element_size()
    smem = shared_memory_bytes(q.device)
    block_m, block_d = tiles["BLOCK_M"], tiles["BLOCK_D"]

    def fits(c):
        staged = c["num_stages"] * 2 * c["BLOCK_N"] * block_d * elem
        operands = tiles_in_flight * (block_m + c["BLOCK_N"]) * block_d * elem
        return staged + operands <= smem

    return fits


def _forward(q, k_ctx, v_ctx, k_blk, v_blk, ctx_len, block_valid, scale, with_lse=False, num_splits=None):
    """The output ``[B, N, γ, Hq, D]``; with ``with_lse`` also each row's log-sum-exp ``[B, N, γ, Hq]`` and the
    output in the accumulator's precision (else those two are placeholders). ``num_splits`` splits each
    block's context among that many programs (default: :func:`_split_count`; always 1 with ``with_lse``)."""
    # The kernel takes any strides with unit steps along the head dimension, the same for K as for V: a decode's
    # context is a view of its cache's first rows, which a copy would cost a pass over every call.
    q = q if q.stride(-1) == 1 else q.contiguous()
    k_ctx, v_ctx = _same_layout(k_ctx, v_ctx)
    k_blk, v_blk = _same_layout(k_blk, v_blk)
    key = ("block_attention", q.shape, k_ctx.shape, q.dtype, q.device, with_lse, num_splits, scale)
    plan = planned(key, lambda: _forward_plan(q, k_ctx, scale, with_lse, num_splits))
    out = empty_output_like(q, dtype=plan.store_dtype)
    lse = empty_output(*q.shape[:-1], dtype=plan.acc_dtype, device=q.device) if with_lse else out
    # Δ = rowsum(dO ∘ O) in the backward cancels to fp32 accuracy only from an O that was never rounded to bf16.
    out_acc = empty_output(*q.shape, dtype=plan.acc_dtype, device=q.device) if with_lse else out
    if q.numel() == 0:
        return _in_dtype(out, q.dtype), lse, out_acc
    parts = stats = out
    if plan.num_splits > 1:
        parts = empty_output(plan.num_splits, *q.shape, dtype=plan.acc_dtype, device=q.device)
        stats = empty_output(plan.num_splits, *q.shape[:-1], 2, dtype=plan.acc_dtype, device=q.device)
    # The kernel reads a bool tensor as bytes, as it does an int8 one; None: every block is valid.
    valid = plan.all_valid if block_valid is None else block_valid.contiguous()
    launch("block_attention", _block_attention_kernel, plan.grid,
           (q, k_ctx, v_ctx, k_blk, v_blk, ctx_len.contiguous(), valid, plan.scale, out, lse, out_acc, parts, stats,
            *plan.sizes, *q.stride()[:4], *k_ctx.stride()[:3], *k_blk.stride()[:4], *plan.out_strides),
           plan.constexprs, device=q.device, table=CONFIGS, key=None, fits=plan.fits, config=plan.config)
    if plan.num_splits > 1:
        return _combine_splits(parts, stats, valid).to(q.dtype), lse, out_acc
    return _in_dtype(out, q.dtype), lse, out_acc


def _in_dtype(out: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``out`` as ``dtype``; tested first because even a ``.to`` that changes nothing costs the host a microsecond,
    a tenth of the launcher's whole host time at batch 1."""
    return out if out.dtype == dtype else out.to(dtype)


class _ForwardPlan(NamedTuple):
    """What a forward call derives from its shapes, dtype and options (see ``dspark.kernels._tuning.planned``)."""

    config: dict
    fits: object  # the shape predicate the config was chosen by (the compile matrix compiles what it keeps)
    constexprs: dict
    grid: tuple
    num_splits: int
    sizes: tuple
    out_strides: tuple
    scale: torch.Tensor
    store_dtype: torch.dtype
    acc_dtype: torch.dtype
    all_valid: torch.Tensor


def _forward_plan(q, k_ctx, scale, with_lse, num_splits) -> _ForwardPlan:
    batch, num_blocks, gamma, num_heads, head_dim = q.shape
    context, num_kv = k_ctx.shape[1], k_ctx.shape[2]
    group = num_heads // num_kv
    acc_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    if with_lse:
        num_splits = 1
    elif num_splits is None:
        num_splits = _split_count(q.device, batch * num_blocks * num_kv, context)
    num_splits = max(1, min(num_splits, context))
    tiles = _tiles(q, gamma, group, head_dim)
    constexprs = dict(BLOCK_J=max(16, next_power_of_2(gamma)), STORE_LSE=with_lse, SPLIT=num_splits > 1, **tiles)
    kernel_key = (gamma * group, head_dim)
    fits = _fits(q, tiles, 2)
    grid = (batch * num_blocks, num_kv, num_splits)
    return _ForwardPlan(
        config=select_config("block_attention", q.device, CONFIGS, fits, kernel_key), fits=fits,
        constexprs=constexprs, grid=grid, num_splits=num_splits,
        sizes=(num_blocks, gamma, group, head_dim, triton.cdiv(max(context, 1), num_splits)),
        out_strides=_contiguous_strides(q.shape)[:4],  # the outputs are allocated contiguous
        scale=torch.tensor([scale], dtype=acc_dtype, device=q.device), store_dtype=_store_dtype(q.dtype),
        acc_dtype=acc_dtype, all_valid=torch.ones(batch, num_blocks, dtype=torch.bool, device=q.device),
    )


def _same_layout(keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values as they are when they share strides with unit steps along the head dimension (the kernel
    reads both with one set), else contiguous copies."""
    strides = keys.stride()
    if strides == values.stride() and strides[-1] == 1:
        return keys, values
    return keys.contiguous(), values.contiguous()


def _contiguous_strides(shape) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return tuple(reversed(strides))


def _split_count(device: torch.device, programs: int, context: int) -> int:
    """How many programs share each block's context: enough for about two programs per multiprocessor when
    few (block, kv head) pairs are in flight (decode at small batch over a long cache), with at least 512
    context rows per split so each still streams whole tiles; 1 off CUDA and whenever the grid is already full."""
    if device.type != "cuda":
        return 1
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    if programs >= sms:
        return 1
    return max(1, min(triton.cdiv(2 * sms, programs), context // 512))


def _combine_splits(parts: torch.Tensor, stats: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Merge split partials: ``parts [S, B, N, γ, Hq, D]`` unnormalised outputs and ``stats [S, B, N, γ, Hq, 2]``
    their running max and sum. Every row's last split saw the block's own keys, so the merged max is finite."""
    run_max, run_sum = stats.unbind(-1)
    weight = torch.exp(run_max - run_max.amax(0, keepdim=True))  # exp(-inf) = 0 for a split that saw nothing
    out = (weight[..., None] * parts).sum(0) / (weight * run_sum).sum(0)[..., None]
    return out * valid.bool()[:, :, None, None, None]


def _backward(grad_out, out_acc, lse, q, k_ctx, v_ctx, k_blk, v_blk, ctx_len, block_valid, scale):
    """dQ, dK_ctx, dV_ctx, dK_blk, dV_blk, each in its input's dtype and shape."""
    batch, num_blocks, gamma, num_heads, head_dim = q.shape
    context, num_kv = k_ctx.shape[1], k_ctx.shape[2]
    group = num_heads // num_kv
    inputs = (q, k_ctx, v_ctx, k_blk, v_blk)
    grads = [empty_output(*t.shape, dtype=_store_dtype(t.dtype), device=t.device) for t in inputs]
    if q.numel() == 0 or k_ctx.numel() + k_blk.numel() == 0:
        return [g.zero_().to(t.dtype) for g, t in zip(grads, inputs)]
    dq, dk_ctx, dv_ctx, dk_blk, dv_blk = grads
    grad_out = grad_out.contiguous()
    # Δ = rowsum(dO ∘ O): the softmax's own term in dS, one number per row.
    delta = (grad_out.to(lse.dtype) * out_acc).sum(-1).contiguous()
    scale_t = torch.tensor([scale], dtype=lse.dtype, device=q.device)
    ctx_len, valid = ctx_len.contiguous(), block_valid.to(torch.int8).contiguous()
    tiles = _tiles(q, gamma, group, head_dim)
    strides = (q.stride(0), q.stride(1), q.stride(2), q.stride(3), k_ctx.stride(0), k_ctx.stride(1), k_ctx.stride(2))
    launch("block_attention_bwd_query", _block_attention_bwd_query_kernel, (batch * num_blocks, num_kv),
           (q, k_ctx, v_ctx, k_blk, v_blk, grad_out, lse, delta, ctx_len, valid, scale_t, dq, dk_blk, dv_blk,
            num_blocks, gamma, group, head_dim, *strides,
            k_blk.stride(0), k_blk.stride(1), k_blk.stride(2), k_blk.stride(3)),
           dict(BLOCK_J=max(16, next_power_of_2(gamma)), **tiles), device=q.device, table=BWD_QUERY_CONFIGS,
           key=(gamma * group, head_dim), fits=_fits(q, tiles, 4))
    if context == 0:
        return [g.to(t.dtype) for g, t in zip(grads, inputs)]

    # One program per (sequence, context tile of BLOCK_N rows, kv head): the grid depends on the config's tile.
    launch("block_attention_bwd_context", _block_attention_bwd_context_kernel,
           lambda meta: (batch * triton.cdiv(context, meta["BLOCK_N"]), num_kv),
           (q, k_ctx, v_ctx, grad_out, lse, delta, ctx_len, valid, scale_t, dk_ctx, dv_ctx,
            num_blocks, gamma, group, head_dim, context, *strides),
           tiles, device=q.device, table=BWD_CONTEXT_CONFIGS, key=(gamma * group, head_dim), fits=_fits(q, tiles, 4))
    return [g.to(t.dtype) for g, t in zip(grads, inputs)]


class BlockAttentionFunction(torch.autograd.Function):
    """Triton forward and fused Triton backward."""

    @staticmethod
    def forward(ctx, q, k_ctx, v_ctx, k_blk, v_blk, ctx_len, block_valid, scale):
        q, k_ctx, v_ctx, k_blk, v_blk = (t.contiguous() for t in (q, k_ctx, v_ctx, k_blk, v_blk))
        wants_grad = any(ctx.needs_input_grad[:5])
        out, lse, out_acc = _forward(q, k_ctx, v_ctx, k_blk, v_blk, ctx_len, block_valid, scale, with_lse=wants_grad)
        if wants_grad:
            ctx.save_for_backward(q, k_ctx, v_ctx, k_blk, v_blk, ctx_len, block_valid, out_acc, lse)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k_ctx, v_ctx, k_blk, v_blk, ctx_len, block_valid, out_acc, lse = ctx.saved_tensors
        grads = _backward(grad_out, out_acc, lse, q, k_ctx, v_ctx, k_blk, v_blk, ctx_len, block_valid, ctx.scale)
        return (*[g if need else None for g, need in zip(grads, ctx.needs_input_grad[:5])], None, None, None)


def block_attention(q, k_ctx, v_ctx, k_blk, v_blk, ctx_len, block_valid, scale):
    """Triton launcher with the signature of ``dspark.attention.block_attention`` (inputs validated there;
    ``block_valid=None``: every block is valid)."""
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k_ctx, v_ctx, k_blk, v_blk)):
        if block_valid is None:
            block_valid = torch.ones(ctx_len.shape, dtype=torch.bool, device=q.device)
        return BlockAttentionFunction.apply(q, k_ctx, v_ctx, k_blk, v_blk, ctx_len, block_valid, scale)
    return _forward(q, k_ctx, v_ctx, k_blk, v_blk, ctx_len, block_valid, scale)[0]  # no graph to record: decoding
