"""The DSpark training objective (method.md §8): ``0.1·CE + 0.9·L1 + 1.0·BCE(confidence)``, decayed by position.

Per supervised slot (row) with draft logits ``ℓ_d = lm_head(h) + W2·e`` (e the Markov feature of the
previous token) and target logits ``ℓ_t = target_lm_head(h_t)``:

* ``CE = logsumexp(ℓ_d) − ℓ_d[label]``;
* ``L1 = ‖softmax(ℓ_d) − softmax(ℓ_t)‖₁`` (twice the total variation, as the paper's code);
* ``c* = clamp(1 − L1/2, 0, 1)``, detached, and ``BCE = softplus(z) − c*·z`` on the confidence logit z.

Each row carries a weight ``w = exp(−k/λ)·mask`` (λ = 4, k the 0-based slot; see :func:`position_weights`)
and the loss is ``Σ w·(α·CE + β·L1 + γ·BCE) / normalizer`` with ``normalizer = Σ w`` by default (in
data-parallel training, the all-reduced Σ w of every rank, so gradients are token-exact).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dspark._checks import check_tensor, check_token_range, values_checked
from dspark.backend import resolve_backend
from dspark.contract import LossOutput

CE_WEIGHT, L1_WEIGHT, CONFIDENCE_WEIGHT, DECAY = 0.1, 0.9, 1.0, 4.0


def position_weights(eval_mask: torch.Tensor, decay: float = DECAY) -> torch.Tensor:
    """``[..., γ]`` weights ``exp(−k/decay)`` for 0-based slot k, times the (contiguous-prefix) mask."""
    if decay <= 0:
        raise ValueError(f"decay must be positive, got {decay}")
    gamma = eval_mask.shape[-1]
    slots = torch.arange(gamma, device=eval_mask.device, dtype=torch.float64)
    return (torch.exp(-slots / decay) * eval_mask.double()).to(torch.float32)


def dspark_loss(
    hidden: torch.Tensor,
    lm_head: torch.Tensor,
    target_hidden: torch.Tensor,
    target_lm_head: torch.Tensor,
    labels: torch.Tensor,
    weights: torch.Tensor,
    *,
    markov_emb: torch.Tensor | None = None,
    markov_w2: torch.Tensor | None = None,
    confidence_logits: torch.Tensor | None = None,
    normalizer: torch.Tensor | float | None = None,
    ce_weight: float = CE_WEIGHT,
    l1_weight: float = L1_WEIGHT,
    confidence_weight: float = CONFIDENCE_WEIGHT,
    chunk_rows: int | None = None,
    backend: str = "auto",
) -> LossOutput:
    """DSpark loss over M supervised rows (flatten blocks × slots first).

    Args:
        hidden: ``[M, d]`` draft hidden states (final-normed).
        lm_head: ``[V, d]`` the frozen shared LM head.
        target_hidden: ``[M, d_t]`` the target's final-normed hidden state at the same positions.
        target_lm_head: ``[V, d_t]`` the target's LM head (often the same tensor as ``lm_head``).
        labels: ``[M]`` ground-truth next tokens.
        weights: ``[M]`` position weights (0 for unsupervised rows).
        markov_emb: ``[M, r]`` the Markov feature of each row's previous token; with ``markov_w2 [V, r]``
            adds the bias ``markov_emb @ markov_w2ᵀ``. ``None`` for the DFlash baseline.
        confidence_logits: ``[M]`` the confidence head's logits; ``None`` drops the BCE term.
        normalizer: the loss denominator; default ``weights.sum()``.
        chunk_rows: the PyTorch path computes ``[chunk_rows, V]`` logits at a time (with recomputation in
            backward), bounding memory; ``None`` materialises all ``[M, V]`` at once (the plain loss).
        backend: ``auto`` | ``reference`` | ``torch`` | ``triton`` (fused, see ``dspark.kernels.loss``).

    Precision: the PyTorch path runs each vocabulary product (draft head, Markov bias, target head) in the
    operands' dtype when both are bf16 (or both fp16) and everything after it in fp32; with fp32 or fp64
    operands it is exact to that dtype. The reference computes in fp64 (or the inputs' dtype) throughout.
    """
    _check_inputs(hidden, lm_head, target_hidden, target_lm_head, labels, weights, markov_emb, markov_w2,
                  confidence_logits)
    if normalizer is None:
        normalizer = weights.detach().sum()
    normalizer = torch.as_tensor(normalizer, dtype=torch.float64).clamp(min=1e-12)
    coef = dict(ce_weight=ce_weight, l1_weight=l1_weight, confidence_weight=confidence_weight)
    backend = resolve_backend(backend, hidden)
    if backend == "reference":
        from dspark.reference.loss import dspark_loss as reference_dspark_loss

        return reference_dspark_loss(hidden, lm_head, target_hidden, target_lm_head, labels, weights, markov_emb,
                                     markov_w2, confidence_logits, normalizer, **coef)
    if backend == "triton":
        from dspark.kernels import fused_dspark_loss

        return fused_dspark_loss(hidden, lm_head, target_hidden, target_lm_head, labels, weights, markov_emb,
                                 markov_w2, confidence_logits, normalizer, **coef, chunk_rows=chunk_rows)
    rows = hidden.shape[0]
    step = rows if chunk_rows is None else max(1, chunk_rows)
    parts = []
    for start in range(0, rows, step):
        sl = slice(start, start + step)
        args = (hidden[sl], lm_head, target_hidden[sl], target_lm_head, labels[sl], weights[sl],
                None if markov_emb is None else markov_emb[sl], markov_w2,
                None if confidence_logits is None else confidence_logits[sl])
        if chunk_rows is None:
            parts.append(_rows_loss(*args, **coef))
        else:
            parts.append(torch.utils.checkpoint.checkpoint(_rows_loss, *args, **coef, use_reentrant=False))
    total, ce, l1, bce, acceptance = (torch.cat([p[i][None] if p[i].ndim == 0 else p[i] for p in parts])
                                      for i in range(5))
    norm = normalizer.to(total.device, total.dtype)
    return LossOutput(total.sum() / norm, ce.sum() / norm, l1.sum() / norm, bce.sum() / norm, acceptance)


def _rows_loss(hidden, lm_head, target_hidden, target_lm_head, labels, weights, markov_emb, markov_w2,
               confidence_logits, *, ce_weight, l1_weight, confidence_weight):
    """Weighted per-chunk sums: (total, ce, l1, bce) each a scalar, and c* per row."""
    compute = torch.promote_types(hidden.dtype, torch.float32)
    logits = vocab_product(hidden, lm_head, compute)
    if markov_emb is not None:  # added in place in compute precision, without an upcast copy of the bias
        logits.add_(vocab_product(markov_emb, markov_w2, compute, upcast=False))
    with torch.no_grad():
        target_logits = vocab_product(target_hidden, target_lm_head, compute)
    ce, l1 = _CrossEntropyAndL1.apply(logits, target_logits, labels)
    w = weights.to(compute)
    acceptance = (1 - 0.5 * l1.detach()).clamp(0, 1)
    bce = torch.zeros_like(ce)
    if confidence_logits is not None:
        z = confidence_logits.to(compute)
        bce = F.softplus(z) - acceptance * z
    total = (w * (ce_weight * ce + l1_weight * l1 + confidence_weight * bce)).sum()
    return total, (w * ce).sum().detach(), (w * l1).sum().detach(), (w * bce).sum().detach(), acceptance


class _CrossEntropyAndL1(torch.autograd.Function):
    """Per-row ``CE [M]`` and ``L1 [M]`` from ``logits [M, V]``, ``target_logits [M, V]`` and ``labels [M]``.

    The same values autograd gets through ``log_softmax``, ``exp``, ``abs`` and ``gather``, with the
    backward written out: ∂CE/∂ℓ = p − onehot(label) and ∂L1/∂ℓ = p ⊙ (s − ⟨p, s⟩) with s = sign(p − q).
    Autograd's version keeps about six ``[M, V]`` tensors alive and makes about twenty passes over them; this
    keeps two (p and p − q) and makes about half the passes; on a CPU, where these passes were a third of
    a training step, that halves their time.
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, target_logits: torch.Tensor, labels: torch.Tensor):
        probs = torch.softmax(logits, -1)
        # logsumexp from the largest entry's probability, which is at least 1/V and so never underflows;
        # both softmaxes come from the same function, so equal rows give p − q exactly 0.
        top, where = logits.max(-1, keepdim=True)
        lse = top - probs.gather(-1, where).log()
        ce = (lse - logits.gather(-1, labels[:, None])).squeeze(-1)
        diff = torch.softmax(target_logits, -1)
        torch.sub(probs, diff, out=diff)
        l1 = torch.linalg.vector_norm(diff, 1, -1)
        ctx.save_for_backward(probs, diff, labels)
        return ce, l1

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_ce: torch.Tensor, grad_l1: torch.Tensor):
        probs, diff, labels = ctx.saved_tensors
        grad = torch.sign(diff)
        inner = (probs[:, None, :] @ grad[:, :, None]).view(-1)  # ⟨p, s⟩ per row, without an [M, V] product
        grad.mul_(grad_l1[:, None]).add_((grad_ce - grad_l1 * inner)[:, None]).mul_(probs)
        grad.scatter_add_(-1, labels[:, None], -grad_ce[:, None])
        return grad, None, None


def vocab_product(rows: torch.Tensor, table: torch.Tensor,
                  compute: torch.dtype = torch.float32, *, upcast: bool = True) -> torch.Tensor:
    """``rows [M, d] @ table [V, d]ᵀ`` in ``compute`` precision.

    When both operands are bf16 (or both fp16) the product runs in that dtype (fp32 accumulation inside
    the GEMM, about 2× faster on CPUs with bf16 units) and only its result is upcast (left half with
    ``upcast=False``, for a caller that adds it into a ``compute`` tensor), so everything after the
    vocabulary products stays in ``compute``.
    """
    if rows.dtype == table.dtype and rows.dtype in (torch.bfloat16, torch.float16):
        product = rows @ table.T
        return product.to(compute) if upcast else product
    return rows.to(compute) @ table.to(compute).T


def _check_inputs(hidden, lm_head, target_hidden, target_lm_head, labels, weights, markov_emb, markov_w2,
                  confidence_logits) -> None:
    check_tensor("hidden", hidden, ndim=2, floating=True)
    rows, dim = hidden.shape
    check_tensor("lm_head", lm_head, shape=(None, dim), floating=True)
    vocab = lm_head.shape[0]
    check_tensor("target_hidden", target_hidden, shape=(rows, None), floating=True)
    check_tensor("target_lm_head", target_lm_head, shape=(vocab, target_hidden.shape[1]), floating=True)
    check_tensor("labels", labels, shape=(rows,), integer=True)
    check_token_range("labels", labels, vocab)
    check_tensor("weights", weights, shape=(rows,), floating=True, finite=True)
    if values_checked() and bool((weights < 0).any()):
        raise ValueError("weights must be non-negative")
    if (markov_emb is None) != (markov_w2 is None):
        raise ValueError("pass both markov_emb and markov_w2, or neither")
    if markov_emb is not None:
        check_tensor("markov_emb", markov_emb, shape=(rows, None), floating=True)
        check_tensor("markov_w2", markov_w2, shape=(vocab, markov_emb.shape[1]), floating=True)
    if confidence_logits is not None:
        check_tensor("confidence_logits", confidence_logits, shape=(rows,), floating=True)
