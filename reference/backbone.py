"""Oracle for dspark.backbone: the whole draft forward pass, one block at a time, from a state dict.

Each block is recomputed from scratch over exactly the context rows it may see (``< anchor``), so the
mask of method.md §2.3 holds by construction here rather than by masking.
"""

from __future__ import annotations

import math

import torch


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return weight * x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)


def rope(x: torch.Tensor, position: int, theta: float) -> torch.Tensor:
    """Rotate one head vector ``[D]``: pair (i, i + D/2) turns by ``position · θ^(−2i/D)``."""
    half = x.shape[0] // 2
    out = torch.empty_like(x)
    for i in range(half):
        angle = position * theta ** (-2 * i / x.shape[0])
        c, s = math.cos(angle), math.sin(angle)
        out[i] = x[i] * c - x[i + half] * s
        out[i + half] = x[i + half] * c + x[i] * s
    return out


def _keys_values(params, prefix, config, rows, positions):
    """Per-kv-head keys (normed, rotated) and values of ``rows [n, d]`` at ``positions``."""
    hd = config.head_dim
    keys, values = [], []
    for row, pos in zip(rows, positions):
        k = (params[prefix + "k_proj.weight"] @ row).reshape(-1, hd)
        v = (params[prefix + "v_proj.weight"] @ row).reshape(-1, hd)
        if config.qk_norm:
            k = rms_norm(k, params[prefix + "k_norm.weight"], config.rms_norm_eps)
        keys.append(torch.stack([rope(head, pos, config.rope_theta) for head in k]))
        values.append(v)
    return keys, values


def draft_block(params: dict, config, anchor_id: int, anchor_pos: int, tap_features: torch.Tensor):
    """Hidden states ``[γ, d]`` of one block whose anchor sits at ``anchor_pos``.

    ``tap_features [S, taps·H_t]`` holds the whole sequence; only rows ``< anchor_pos`` are read.
    """
    gamma, hd, eps = config.block_size, config.head_dim, config.rms_norm_eps
    group = config.num_attention_heads // config.num_key_value_heads
    context = [rms_norm(params["fc.weight"] @ f, params["hidden_norm.weight"], eps) for f in tap_features[:anchor_pos]]
    ids = [anchor_id] + [config.mask_token_id] * (gamma - 1)
    x = torch.stack([params["embed_tokens.weight"][i] for i in ids])
    positions = [anchor_pos + k for k in range(gamma)]
    for layer in range(config.num_draft_layers):
        p = f"layers.{layer}."
        a = p + "self_attn."
        normed = rms_norm(x, params[p + "input_layernorm.weight"], eps)
        ctx_k, ctx_v = _keys_values(params, a, config, context, range(anchor_pos))
        blk_k, blk_v = _keys_values(params, a, config, normed, positions)
        attn_out = []
        for i in range(gamma):
            q = (params[a + "q_proj.weight"] @ normed[i]).reshape(-1, hd)
            heads = []
            for h in range(config.num_attention_heads):
                qh = q[h]
                if config.qk_norm:
                    qh = rms_norm(qh, params[a + "q_norm.weight"], eps)
                qh = rope(qh, positions[i], config.rope_theta)
                kv = h // group
                keys = torch.stack([k[kv] for k in ctx_k + blk_k])
                values = torch.stack([v[kv] for v in ctx_v + blk_v])
                scores = keys @ qh / math.sqrt(hd)
                weights = torch.exp(scores - scores.max())
                heads.append((weights / weights.sum()) @ values)
            attn_out.append(params[a + "o_proj.weight"] @ torch.cat(heads))
        x = x + torch.stack(attn_out)
        normed = rms_norm(x, params[p + "post_attention_layernorm.weight"], eps)
        gate = normed @ params[p + "mlp.gate_proj.weight"].T
        up = normed @ params[p + "mlp.up_proj.weight"].T
        x = x + (gate * torch.sigmoid(gate) * up) @ params[p + "mlp.down_proj.weight"].T
    return rms_norm(x, params["norm.weight"], eps)


def draft_forward(params: dict, config, anchor_ids, anchor_pos, tap_features, block_valid=None):
    """``[B, N, γ, d]`` hidden states; padding blocks (``block_valid`` False) are left as zeros."""
    batch, num_blocks = anchor_ids.shape
    out = torch.zeros(batch, num_blocks, config.block_size, config.hidden_size, dtype=tap_features.dtype)
    for b in range(batch):
        for n in range(num_blocks):
            if block_valid is not None and not bool(block_valid[b, n]):
                continue
            out[b, n] = draft_block(params, config, int(anchor_ids[b, n]), int(anchor_pos[b, n]), tap_features[b])
    return out
