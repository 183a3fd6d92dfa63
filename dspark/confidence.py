"""Confidence head (method.md §5.1): how likely each drafted token is to be accepted, given its prefix was.

``c_k = σ(w·[h_k; W1[x_{k−1}]] + b)`` estimates the *conditional* acceptance of slot k, so the chance that
the verifier keeps slots 1..k is the survival ``a_k = Π_{i≤k} c_i``. Its training target is the analytic
acceptance rate of speculative sampling, ``1 − ½‖p_d − p_t‖₁``.
"""

from __future__ import annotations

import torch
from torch import nn

from dspark._checks import check_once, check_tensor, check_token_range, values_checked
from dspark.backend import resolve_backend
from dspark.linear import Linear


def confidence_target(draft_logits: torch.Tensor, target_logits: torch.Tensor) -> torch.Tensor:
    """Soft label ``clamp(1 − ½‖softmax(draft) − softmax(target)‖₁, 0, 1)`` at T = 1, detached.

    Args:
        draft_logits: ``[..., V]`` Markov-corrected draft logits.
        target_logits: ``[..., V]`` the target's teacher-forced logits at the same positions.

    Returns:
        ``[...]`` acceptance probabilities, in fp32 or wider.
    """
    check_tensor("draft_logits", draft_logits, floating=True, finite=True)
    check_tensor("target_logits", target_logits, floating=True, finite=True)
    if draft_logits.shape != target_logits.shape:
        raise ValueError(
            f"draft_logits {tuple(draft_logits.shape)} and target_logits {tuple(target_logits.shape)} must match"
        )
    dtype = torch.promote_types(draft_logits.dtype, torch.float32)
    with torch.no_grad():
        draft_probs = torch.softmax(draft_logits.to(dtype), -1)
        target_probs = torch.softmax(target_logits.to(dtype), -1)
        l1 = (draft_probs - target_probs).abs().sum(-1)
        return (1 - 0.5 * l1).clamp(0, 1)


def confidence_survival(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    prev_ids: torch.Tensor | None = None,
    markov_w1: torch.Tensor | None = None,
    temperatures: torch.Tensor | None = None,
    *,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Confidence logits, calibrated conditional confidences and prefix survival of every slot.

    Args:
        hidden: ``[R, γ, d]`` final-normed backbone hidden states (the vectors that feed ``lm_head``).
        weight: ``[1, d]`` or ``[1, d + r]`` (the second when the head reads the Markov embedding).
        bias: ``[1]`` or ``None`` (DeepSeek-V4 heads have none).
        prev_ids: ``[R, γ]`` previous tokens ``[x_0, …, x_{γ−1}]`` in the target vocabulary.
        markov_w1: ``[V, r]`` the Markov embedding table; needed iff ``weight`` has ``d + r`` columns.
        temperatures: ``[γ]`` STS temperatures (method.md §5.2); ``None`` means all 1.

    Returns:
        ``(logits [R, γ], confidence [R, γ] = σ(logits / T), survival [R, γ] = cumprod(confidence))``, in
        float32 for half-precision inputs (every backend accumulates in float32), float64 for float64 ones.
    """
    check_once(_check_inputs, hidden, weight, bias, prev_ids, markov_w1, temperatures)
    backend = resolve_backend(backend, hidden)
    if backend == "reference":
        from dspark.reference.confidence import confidence_survival as reference_confidence_survival

        return reference_confidence_survival(hidden, weight, bias, prev_ids, markov_w1, temperatures)
    if backend == "triton":
        from dspark.kernels import confidence_survival as triton_confidence_survival

        return triton_confidence_survival(hidden, weight, bias, prev_ids, markov_w1, temperatures)
    compute = torch.promote_types(hidden.dtype, torch.float32)  # the kernel's accumulation, and its output dtype
    rank = weight.shape[1] - hidden.shape[2]
    features = hidden if rank == 0 else torch.cat([hidden, markov_w1[prev_ids].to(hidden.dtype)], -1)
    logits = (features.to(compute) @ weight.to(compute).T).squeeze(-1)
    if bias is not None:
        logits = logits + bias.to(compute)
    scaled = logits if temperatures is None else logits / temperatures
    confidence = torch.sigmoid(scaled)
    return logits, confidence, confidence.cumprod(-1)


def _check_inputs(hidden, weight, bias, prev_ids, markov_w1, temperatures) -> None:
    check_tensor("hidden", hidden, ndim=3, floating=True, finite=True)
    num_requests, gamma, hidden_size = hidden.shape
    check_tensor("weight", weight, ndim=2, floating=True)
    if weight.shape[0] != 1:
        raise ValueError(f"weight must have shape [1, in_features], got {tuple(weight.shape)}")
    rank = weight.shape[1] - hidden_size
    if rank < 0:
        raise ValueError(f"weight has {weight.shape[1]} inputs, fewer than hidden size {hidden_size}")
    if rank > 0:
        if markov_w1 is None or prev_ids is None:
            raise ValueError(f"weight reads a rank-{rank} Markov embedding: pass prev_ids and markov_w1")
        check_tensor("markov_w1", markov_w1, shape=(None, rank), floating=True)
        check_tensor("prev_ids", prev_ids, shape=(num_requests, gamma), integer=True)
        check_token_range("prev_ids", prev_ids, markov_w1.shape[0])
    if bias is not None:
        check_tensor("bias", bias, shape=(1,), floating=True)
    if temperatures is not None:
        check_tensor("temperatures", temperatures, shape=(gamma,), floating=True, finite=True)
        if values_checked() and bool((temperatures <= 0).any()):
            raise ValueError("temperatures must be positive")


class ConfidenceHead(nn.Module):
    """``confidence_head.proj``: Linear(d (+ r) → 1), bias optional (method.md §10 tensor names).

    ``forward(hidden [..., d], prev_emb [..., r] | None) → logits [...]``. Features are not detached, as
    in DeepSpec, so the BCE gradient reaches the backbone and W1 (method.md §5.1).
    """

    def __init__(self, hidden_size: int, markov_rank: int = 0, bias: bool = True):
        super().__init__()
        self.markov_rank = markov_rank
        self.proj = Linear(hidden_size + markov_rank, 1, bias=bias)

    def forward(self, hidden: torch.Tensor, prev_emb: torch.Tensor | None = None) -> torch.Tensor:
        if self.markov_rank:
            if prev_emb is None or prev_emb.shape[-1] != self.markov_rank:
                raise ValueError(f"this head reads a rank-{self.markov_rank} Markov embedding as prev_emb")
            hidden = torch.cat([hidden, prev_emb], -1)
        return self.proj(hidden).squeeze(-1)
