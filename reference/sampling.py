"""Oracle for dspark.sampling: one row at a time, the definitions written out as loops."""

from __future__ import annotations

import math
from fractions import Fraction

import torch

from dspark.contract import FIXED_POINT_ONE


def warp_row(logits: torch.Tensor, temperature: float, top_k: int | None, top_p: float | None) -> torch.Tensor:
    """Sampled distribution of one row ``[V]`` (see ``dspark.sampling.warp_logits`` for the rules)."""
    vocab = logits.shape[0]
    values = [float(x) for x in logits]
    if temperature == 0:
        best = 0
        for v in range(vocab):
            if values[v] > values[best]:
                best = v
        out = torch.zeros(vocab, dtype=logits.dtype)
        out[best] = 1
        return out
    values = [x / temperature for x in values]
    keep = [True] * vocab
    if top_k is not None and top_k < vocab:
        kth = sorted(values, reverse=True)[top_k - 1]
        keep = [x >= kth for x in values]
    top = max(x for x, k in zip(values, keep) if k)
    weights = [math.exp(x - top) if k else 0.0 for x, k in zip(values, keep)]
    total = sum(weights)
    probs = [w / total for w in weights]
    if top_p is not None and top_p < 1:
        # Token v stays iff the fixed-point mass of strictly more probable tokens is below top_p's.
        fixed = [fixed_point_mass(p) for p in probs]
        kept = []
        for v in range(vocab):
            more_probable = sum(m for p, m in zip(probs, fixed) if p > probs[v])
            kept.append(probs[v] > 0 and more_probable < top_p_threshold(top_p))
        total = sum(p for p, k in zip(probs, kept) if k)
        probs = [p / total if k else 0.0 for p, k in zip(probs, kept)]
    return torch.tensor(probs, dtype=logits.dtype)


def top_p_threshold(top_p: float) -> int:
    """``⌈top_p · 2^48⌉``, computed exactly with rationals: a token survives top-p iff the fixed-point mass of
    strictly more probable tokens is below it."""
    return math.ceil(Fraction(top_p) * FIXED_POINT_ONE)


def fixed_point_mass(p: float) -> int:
    """``⌊p · 2^48⌋`` (exact: scaling a float by a power of two only moves its exponent)."""
    return int(p * FIXED_POINT_ONE)


def sample_row(probs: torch.Tensor, u: float) -> int:
    """Inverse CDF of one row in fixed point: first v whose integer cumulative mass exceeds ⌊u · total⌋,
    else (u · total rounded up to total) the last v with mass."""
    weights = [fixed_point_mass(float(p)) for p in probs]
    threshold = int(u * float(sum(weights)))
    running = 0
    for v, w in enumerate(weights):
        running += w
        if running > threshold:
            return v
    return max(v for v, w in enumerate(weights) if w > 0)
