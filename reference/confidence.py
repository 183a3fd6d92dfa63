"""Oracle for dspark.confidence: per request, per position (method.md §5)."""

from __future__ import annotations

import math

import torch


def confidence_target(draft_logits: torch.Tensor, target_logits: torch.Tensor) -> torch.Tensor:
    """``1 − ½ Σ_v |p_d(v) − p_t(v)|`` per row, written as ``Σ_v min(p_d, p_t)``'s twin, in float64."""
    flat_draft = draft_logits.reshape(-1, draft_logits.shape[-1]).double()
    flat_target = target_logits.reshape(-1, target_logits.shape[-1]).double()
    out = torch.empty(flat_draft.shape[0], dtype=torch.float64)
    for i in range(flat_draft.shape[0]):
        draft_probs = torch.softmax(flat_draft[i], 0)
        target_probs = torch.softmax(flat_target[i], 0)
        l1 = sum(abs(float(a) - float(b)) for a, b in zip(draft_probs, target_probs))
        out[i] = min(max(1 - 0.5 * l1, 0.0), 1.0)
    return out.reshape(draft_logits.shape[:-1])


def sigmoid(x: float) -> float:
    """Logistic function that never overflows ``math.exp``."""
    if x >= 0:
        return 1 / (1 + math.exp(-x))
    e = math.exp(x)
    return e / (1 + e)


def confidence_survival(hidden, weight, bias, prev_ids, markov_w1, temperatures):
    """Logits, ``σ(z_k / T_k)`` and ``a_k = Π_{i≤k} c_i``, one request and one slot at a time; float32 for
    half-precision inputs (float64 stays float64)."""
    compute = torch.promote_types(hidden.dtype, torch.float32)
    hidden, weight = hidden.to(compute), weight.to(compute)
    bias = None if bias is None else bias.to(compute)
    markov_w1 = None if markov_w1 is None else markov_w1.to(compute)
    num_requests, gamma, hidden_size = hidden.shape
    rank = weight.shape[1] - hidden_size
    logits = torch.empty(num_requests, gamma, dtype=hidden.dtype)
    confidence = torch.empty_like(logits)
    survival = torch.empty_like(logits)
    for r in range(num_requests):
        alive = 1.0
        for k in range(gamma):
            features = hidden[r, k]
            if rank:
                features = torch.cat([features, markov_w1[int(prev_ids[r, k])]])
            z = float(weight[0] @ features) + (float(bias[0]) if bias is not None else 0.0)
            t = float(temperatures[k]) if temperatures is not None else 1.0
            c = sigmoid(z / t)
            alive *= c
            logits[r, k], confidence[r, k], survival[r, k] = z, c, alive
    return logits, confidence, survival
