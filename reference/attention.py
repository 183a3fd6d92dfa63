"""Oracle for dspark.attention.block_attention: a dense masked softmax, one block, head and query at a time."""

from __future__ import annotations

import torch


def block_attention(q, k_ctx, v_ctx, k_blk, v_blk, ctx_len, block_valid, scale):
    """See :func:`dspark.attention.block_attention` for shapes; computes in the inputs' dtype."""
    batch, num_blocks, gamma, num_heads, head_dim = q.shape
    group = num_heads // k_ctx.shape[2]
    out = torch.zeros_like(q)
    for b in range(batch):
        for n in range(num_blocks):
            if not bool(block_valid[b, n]):
                continue  # padding blocks see nothing
            visible = int(ctx_len[b, n])
            for h in range(num_heads):
                kv = h // group
                keys = torch.cat([k_ctx[b, :visible, kv], k_blk[b, n, :, kv]])
                values = torch.cat([v_ctx[b, :visible, kv], v_blk[b, n, :, kv]])
                for i in range(gamma):
                    scores = (keys @ q[b, n, i, h]) * scale
                    weights = torch.exp(scores - scores.max())
                    out[b, n, i, h] = (weights / weights.sum()) @ values
    return out
