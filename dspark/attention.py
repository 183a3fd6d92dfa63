"""Block attention with KV injection (method.md §2.2, §2.3): the one attention pattern of the DSpark backbone.

Every query block b (γ slots) attends to
* the context keys j of its own sequence with ``j < ctx_len[b]`` (strictly before the anchor: the anchor's
  own target features do not exist yet when it is drafted), and
* all γ keys of its own block (bidirectional),
and to nothing else. Training lays many blocks (anchors) over one context; inference lays one block per
request over that request's context cache. Both are the same call.
"""

from __future__ import annotations

import math

import torch
from einops import rearrange

from dspark._checks import check_once, check_range, check_tensor
from dspark.backend import resolve_backend


def block_attention(
    q: torch.Tensor,
    k_ctx: torch.Tensor,
    v_ctx: torch.Tensor,
    k_blk: torch.Tensor,
    v_blk: torch.Tensor,
    ctx_len: torch.Tensor,
    block_valid: torch.Tensor | None = None,
    *,
    scale: float | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """Attention of block queries over ``[visible context | own block]``.

    Args:
        q: ``[B, N, γ, Hq, D]`` queries of N blocks per sequence.
        k_ctx, v_ctx: ``[B, S, Hkv, D]`` context keys and values (already normed and rotated).
        k_blk, v_blk: ``[B, N, γ, Hkv, D]`` the blocks' own keys and values.
        ctx_len: ``[B, N]`` int: block n of sequence b sees context rows ``j < ctx_len[b, n]``.
        block_valid: ``[B, N]`` bool; padding blocks see nothing and output zeros. ``None``: all valid.
        scale: softmax scale, default ``1/√D``.
        backend: ``auto`` | ``reference`` | ``torch`` | ``triton``.

    Returns:
        ``[B, N, γ, Hq, D]`` in the dtype of ``q``. GQA: query head h reads kv head ``h // (Hq/Hkv)``.
    """
    check_once(_check_inputs, q, k_ctx, v_ctx, k_blk, v_blk, ctx_len, block_valid)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    backend = resolve_backend(backend, q)
    if backend == "triton":
        from dspark.kernels import block_attention as triton_block_attention

        return triton_block_attention(q, k_ctx, v_ctx, k_blk, v_blk, ctx_len, block_valid, scale)
    if block_valid is None:
        block_valid = torch.ones(ctx_len.shape, dtype=torch.bool, device=q.device)
    if backend == "reference":
        from dspark.reference.attention import block_attention as reference_block_attention

        return reference_block_attention(q, k_ctx, v_ctx, k_blk, v_blk, ctx_len, block_valid, scale)
    return _block_attention_torch(q, k_ctx, v_ctx, k_blk, v_blk, ctx_len, block_valid, scale)


def _block_attention_torch(q, k_ctx, v_ctx, k_blk, v_blk, ctx_len, block_valid, scale):
    num_kv = k_ctx.shape[2]
    dtype = q.dtype
    compute = torch.promote_types(dtype, torch.float32)
    qg = rearrange(q.to(compute), "b n q (h g) d -> b n h g q d", h=num_kv)
    scores_ctx = torch.einsum("bnhgqd,bshd->bnhgqs", qg, k_ctx.to(compute)) * scale
    scores_blk = torch.einsum("bnhgqd,bnkhd->bnhgqk", qg, k_blk.to(compute)) * scale
    visible = torch.arange(k_ctx.shape[1], device=q.device) < ctx_len[..., None]  # [B, N, S]
    scores_ctx = scores_ctx.masked_fill(~visible[:, :, None, None, None, :], float("-inf"))
    probs = torch.softmax(torch.cat([scores_ctx, scores_blk], -1), -1)
    probs_ctx, probs_blk = probs.split([k_ctx.shape[1], k_blk.shape[2]], -1)
    out = torch.einsum("bnhgqs,bshd->bnhgqd", probs_ctx, v_ctx.to(compute))
    out = out + torch.einsum("bnhgqk,bnkhd->bnhgqd", probs_blk, v_blk.to(compute))
    out = out * block_valid[:, :, None, None, None, None]
    return rearrange(out, "b n h g q d -> b n q (h g) d").to(dtype)


def _check_inputs(q, k_ctx, v_ctx, k_blk, v_blk, ctx_len, block_valid) -> None:
    check_tensor("q", q, ndim=5, floating=True)
    batch, num_blocks, gamma, num_heads, head_dim = q.shape
    check_tensor("k_ctx", k_ctx, shape=(batch, None, None, head_dim), floating=True)
    num_kv = k_ctx.shape[2]
    check_tensor("v_ctx", v_ctx, shape=tuple(k_ctx.shape), floating=True)
    check_tensor("k_blk", k_blk, shape=(batch, num_blocks, gamma, num_kv, head_dim), floating=True)
    check_tensor("v_blk", v_blk, shape=tuple(k_blk.shape), floating=True)
    check_tensor("ctx_len", ctx_len, shape=(batch, num_blocks), integer=True)
    if num_heads % num_kv:
        raise ValueError(f"query heads ({num_heads}) must be a multiple of kv heads ({num_kv})")
    check_range("ctx_len", ctx_len, 0, k_ctx.shape[1], " (the context length)")
    if block_valid is not None:
        check_tensor("block_valid", block_valid, shape=(batch, num_blocks))
        if block_valid.dtype != torch.bool:
            raise ValueError(f"block_valid must be a bool tensor, got {block_valid.dtype}")
