"""Sampling with injected randomness: the distribution actually sampled from, and inverse-CDF draws.

Every sampler in dspark takes its uniforms as a tensor, so the reference, the PyTorch module and the
Triton kernel return the same tokens for the same draws. The warped distribution is what the verifier
needs as ``draft_probs`` (method.md §4.2, §7: rejection sampling is exact only against the distribution the
token really came from).

Masses are summed in fixed point. A floating-point cumulative sum depends on the order of its additions,
so a sequential scan, a tiled kernel and a Python loop disagree when ``u · total`` lands exactly on a
cumulative mass (uniform logits and ``u = 0.5``, say). Every tier therefore turns each probability into
the integer ``⌊p · 2^48⌋`` (:func:`fixed_point`) and sums those: integer sums are exact in any order.
The draw is the first index whose integer cumulative mass exceeds ``⌊u · total⌋`` (the product in
float64), and top-p compares integer masses with ``⌈top_p · 2^48⌉``. Quantising moves a probability by
less than ``2^-48``: tokens below that can never be drawn, a change far under float32's own rounding.
"""

from __future__ import annotations

import math

import torch

from dspark._checks import check_sampling, check_tensor, check_uniforms, values_checked
from dspark.contract import FIXED_POINT_ONE, MAX_ROW_MASS


def fixed_point(probs: torch.Tensor) -> torch.Tensor:
    """``⌊p · 2^48⌋`` as int64: the exact, order-free masses every sampler sums (``p >= 0``)."""
    return (probs.double() * FIXED_POINT_ONE).long()


def top_p_threshold(top_p: float) -> int:
    """``⌈top_p · 2^48⌉``: token v survives top-p iff the fixed-point mass strictly above it is below this."""
    return math.ceil(top_p * FIXED_POINT_ONE)


def warp_logits(
    logits: torch.Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
) -> torch.Tensor:
    """The distribution a sampler draws from: temperature, then top-k, then top-p, renormalised.

    Args:
        logits: ``[..., V]`` finite logits.
        temperature: 0 means greedy: a one-hot at the first argmax.
        top_k: keep tokens whose logit is at least the k-th largest (ties at the boundary are kept).
        top_p: keep token v iff the fixed-point mass of tokens strictly more probable than v is below
            :func:`top_p_threshold` (ties are kept or dropped together, so the set never depends on sort
            order, and the integer sums make it independent of summation order too).

    Returns:
        ``[..., V]`` probabilities in the dtype of ``logits`` (at least fp32), each row summing to 1.
    """
    check_tensor("logits", logits, floating=True, finite=True)
    vocab = logits.shape[-1]
    check_sampling(temperature, top_k, top_p, vocab)
    work = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
    if temperature == 0:
        return torch.nn.functional.one_hot(work.argmax(-1), vocab).to(work.dtype)
    work = work / temperature
    if top_k is not None and top_k < vocab:
        kth = work.topk(top_k, dim=-1).values[..., -1:]
        work = work.masked_fill(work < kth, float("-inf"))
    probs = torch.softmax(work, dim=-1)
    if top_p is not None and top_p < 1:
        sorted_probs = probs.sort(dim=-1, descending=True).values
        sorted_mass = fixed_point(sorted_probs)
        mass_before = sorted_mass.cumsum(-1) - sorted_mass
        last_kept = (mass_before < top_p_threshold(top_p)).sum(-1, keepdim=True) - 1
        cutoff = sorted_probs.gather(-1, last_kept)
        probs = torch.where(probs >= cutoff, probs, torch.zeros_like(probs))
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample_from_probs(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF sampling in fixed point: the first token whose cumulative mass exceeds ``⌊u · total⌋``.

    Args:
        probs: ``[..., V]`` non-negative weights: a distribution, or part of one such as the residual
            ``max(p − q, 0)`` (rows need not sum to 1, but at most to 2, and need mass of at least 2^-48).
        uniforms: ``[...]`` draws in ``[0, 1)``.

    Returns:
        ``[...]`` int64 token ids, always of positive weight.
    """
    check_tensor("probs", probs, floating=True, finite=True)
    check_tensor("uniforms", uniforms, shape=tuple(probs.shape[:-1]), floating=True)
    check_uniforms("uniforms", uniforms)
    bad = f"probs must hold non-negative weights whose rows sum to at most {MAX_ROW_MASS}"
    if values_checked() and probs.numel() and (bool((probs < 0).any()) or float(probs.amax()) > MAX_ROW_MASS):
        raise ValueError(bad)
    mass = fixed_point(probs)
    cdf = mass.cumsum(-1)
    if values_checked() and probs.numel() and int(cdf[..., -1].max()) > MAX_ROW_MASS * FIXED_POINT_ONE:
        raise ValueError(bad)
    threshold = (uniforms.double() * cdf[..., -1].double()).long()
    token = (cdf <= threshold[..., None]).sum(-1)
    # u·total can round up to total when u is a float64 just below 1; fall back to the last token with mass.
    last_positive = probs.shape[-1] - 1 - (mass.flip(-1) > 0).to(torch.int8).argmax(-1)
    return torch.minimum(token, last_positive)
