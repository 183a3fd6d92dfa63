"""Sampling with injected randomness: the distribution actually sampled from, and inverse-CDF draws.

Every sampler in dspark takes its uniforms as a tensor, so the reference, the PyTorch module and the
Triton kernel return the same tokens for the same draws. The warped distribution is what the verifier
needs as ``draft_probs`` (method.md §4.2, §7: rejection sampling is exact only against the distribution the
token really came from).
"""

from __future__ import annotations

import torch

from dspark._checks import check_sampling, check_tensor, check_uniforms


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
        top_p: keep token v iff the mass of tokens strictly more probable than v is below ``top_p``
            (ties are kept or dropped together, so the set never depends on sort order).

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
        mass_before = sorted_probs.cumsum(-1) - sorted_probs
        last_kept = (mass_before < top_p).sum(-1, keepdim=True) - 1
        cutoff = sorted_probs.gather(-1, last_kept)
        probs = torch.where(probs >= cutoff, probs, torch.zeros_like(probs))
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample_from_probs(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF sampling: the first token whose cumulative mass exceeds ``u · total``.

    Args:
        probs: ``[..., V]`` non-negative weights (need not sum to 1; each row needs positive mass).
        uniforms: ``[...]`` draws in ``[0, 1)``.

    Returns:
        ``[...]`` int64 token ids, always of positive weight.
    """
    check_tensor("probs", probs, floating=True)
    check_tensor("uniforms", uniforms, shape=tuple(probs.shape[:-1]), floating=True)
    check_uniforms("uniforms", uniforms)
    cdf = probs.cumsum(-1)
    threshold = uniforms.to(cdf.dtype).unsqueeze(-1) * cdf[..., -1:]
    token = (cdf <= threshold).sum(-1)
    # u·total can round up to total; fall back to the last token that carries mass.
    last_positive = probs.shape[-1] - 1 - (probs.flip(-1) > 0).to(torch.int8).argmax(-1)
    return torch.minimum(token, last_positive)
