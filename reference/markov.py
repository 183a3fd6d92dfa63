"""Oracle for dspark.markov: one request, one slot, one vector at a time (method.md §4)."""

from __future__ import annotations

import torch
from dspark.reference.sampling import sample_row, warp_row


def _sigmoid(x: torch.Tensor) -> torch.Tensor:
    return 1 / (1 + torch.exp(-x))


def bias_one(weights, prev_id: int, hidden: torch.Tensor, state: torch.Tensor | None):
    """Bias ``[V_draft]`` of one slot of one request, and the RNN state ``s_k`` (method.md §4.1)."""
    emb = weights.w1[prev_id]
    if weights.head_type == "vanilla":
        return weights.w2 @ emb, None
    if weights.head_type == "gated":
        gate = _sigmoid(weights.gate_weight @ torch.cat([hidden, emb]) + weights.gate_bias)
        return weights.w2 @ (gate * emb), None
    rank = emb.shape[0]
    s_prev = torch.zeros(rank, dtype=emb.dtype) if state is None else state
    z = torch.cat([s_prev, emb, hidden])
    joint = weights.joint_weight @ z + weights.joint_bias
    gate, cand, out = joint[:rank], joint[rank : 2 * rank], joint[2 * rank :]
    gate = _sigmoid(gate)
    s_new = gate * s_prev + (1 - gate) * torch.tanh(cand)
    return weights.w2 @ torch.tanh(out), s_new


def teacher_forced_bias(weights, prev_ids: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
    """``[N, γ, V_draft]`` bias; slot k reads ``prev_ids[n, k]`` (anchor first) and the state of slot k−1."""
    num_blocks, gamma = prev_ids.shape
    out = torch.empty(num_blocks, gamma, weights.w2.shape[0], dtype=hidden.dtype)
    for n in range(num_blocks):
        state = None
        for k in range(gamma):
            out[n, k], state = bias_one(weights, int(prev_ids[n, k]), hidden[n, k], state)
    return out


def sample_block(
    base_logits, hidden, anchor_ids, uniforms, weights, *, temperature, top_k, top_p, draft_to_target=None
):
    """Left-to-right block sampling, request by request, slot by slot (method.md §4.2).

    Half-precision inputs are computed, and their probabilities returned, in float32 (float64 stays float64)."""
    compute = torch.promote_types(base_logits.dtype, torch.float32)
    base_logits, hidden = base_logits.to(compute), hidden.to(compute)
    if weights is not None:
        weights = weights._replace(**{name: value.to(compute) for name, value in weights._asdict().items()
                                      if isinstance(value, torch.Tensor) and value.is_floating_point()})
    num_requests, gamma, vocab = base_logits.shape
    tokens = torch.empty(num_requests, gamma, dtype=torch.long)
    probs = torch.empty(num_requests, gamma, vocab, dtype=base_logits.dtype)
    for r in range(num_requests):
        prev = int(anchor_ids[r])
        state = None
        for k in range(gamma):
            logits = base_logits[r, k]
            if weights is not None:
                bias, state = bias_one(weights, prev, hidden[r, k], state)
                logits = logits + bias
            probs[r, k] = warp_row(logits, temperature, top_k, top_p)
            tokens[r, k] = sample_row(probs[r, k], float(uniforms[r, k]))
            prev = int(tokens[r, k]) if draft_to_target is None else int(draft_to_target[tokens[r, k]])
    return tokens, probs
