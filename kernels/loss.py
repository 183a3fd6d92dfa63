"""Fused DSpark loss: forward and backward of ``0.1·CE + 0.9·L1 + 1.0·BCE`` without an ``[N, γ, V]`` fp32 tensor.

Mirrors ``dspark.reference.loss.dspark_loss``. Rows (supervised slots) are processed in chunks of
``chunk_rows``. Per chunk, the two vocabulary projections run as ordinary matmuls into ``[chunk, V]``
buffers (cuBLAS does GEMMs better than a hand-written kernel would), in the operands' dtype when both are
bf16 (or both fp16), exactly as the PyTorch path's products; the heads are never copied to fp32, which at a
150k vocabulary would cost more memory than the plain loss's logits. Then one Triton program per row
streams its vocabulary three times:

1. online max and sum-exp of the draft and target logits, and the label logit;
2. ``L1 = Σ|p_d − p_t|`` and ``S = Σ sign(p_d − p_t)·p_d``;
3. the gradient of the row's loss with respect to its draft logits, written over the draft logits:
   ``g = c·(α·(p_d − onehot) + β·p_d·(sign(p_d − p_t) − S))`` with ``c = w / normalizer``.

The row's CE, L1, c* and the BCE of its confidence logit (and that gradient, ``c·γ·(σ(z) − c*)``) come out
of the same program. The chunk's ``g`` then gives the gradients of the hidden states, the Markov features
and W2 by three matmuls, and the buffers are reused for the next chunk. Peak extra memory is two
``[chunk, V]`` fp32 buffers and one 16-bit product in flight; by default a chunk is an eighth of the rows
(:func:`default_chunk_rows`), at most ~256 MiB per buffer. The gradient matmuls, like autograd's on the
PyTorch path, take the logits' gradient in the heads' dtype. Gradients are computed in the forward pass
(training always needs them) and scaled by the incoming gradient in backward. ``lm_head`` and the target
are frozen, as in DSpark training; the launcher refuses an ``lm_head`` that requires grad.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from dspark.kernels._tuning import empty_output, launch

from dspark.contract import LossOutput
from dspark.loss import vocab_product

CONFIGS = {
    "interpreter": [dict(BLOCK_V=16, num_warps=1, num_stages=1)],
    "sm90": [dict(BLOCK_V=2048, num_warps=8, num_stages=2), dict(BLOCK_V=1024, num_warps=4, num_stages=2)],
    # Blackwell: 2048, the tile with no spill in the compile matrix (4096 spilled 8 B).
    "sm100": [dict(BLOCK_V=2048, num_warps=8, num_stages=2,
                   label="compiled sm_100/sm_103 (Triton 3.9, paper shapes): 64 regs, 0 B spill; unmeasured")],
    "other": [dict(BLOCK_V=1024, num_warps=4, num_stages=1)],
}

# Row chunk when the caller gives none: an eighth of the rows, in multiples of 64 (whole tensor-core tiles for
# the GEMMs), so that the two [chunk, V] fp32 buffers and the 16-bit product in flight (10 bytes per chunk row
# and vocabulary entry) stay under a quarter of what the plain loss keeps for its backward (at least its fp32
# logits, probabilities and target probabilities: 12 bytes per row and entry); at most ~256 MiB per buffer.
_BUFFER_BYTES = 256 * 2**20
_CHUNK_FRACTION, _CHUNK_MULTIPLE = 8, 64


def default_chunk_rows(rows: int, vocab: int) -> int:
    """Rows per chunk for ``rows`` supervised rows over a ``vocab``-wide head (see the constants above)."""
    wanted = _CHUNK_MULTIPLE * max(1, -(-rows // (_CHUNK_FRACTION * _CHUNK_MULTIPLE)))
    return max(1, min(rows, wanted, _BUFFER_BYTES // (4 * max(vocab, 1))))


@triton.jit
def _row_probs(draft_row, target_row, offs, mask, max_d, sum_d, max_t, sum_t):
    """Draft and target probabilities of one vocabulary tile, from the row's max and sum of exponentials."""
    pd = tl.exp(tl.load(draft_row + offs, mask=mask, other=float("-inf")).to(tl.float32) - max_d) / sum_d
    pt = tl.exp(tl.load(target_row + offs, mask=mask, other=float("-inf")).to(tl.float32) - max_t) / sum_t
    return pd, pt


@triton.jit
def _loss_rows_kernel(
    draft_ptr, target_ptr, labels_ptr, coef_ptr, z_ptr,
    ce_ptr, l1_ptr, accept_ptr, bce_ptr, grad_z_ptr,
    vocab, stride_d, stride_t, ce_weight, l1_weight, conf_weight,
    HAS_CONF: tl.constexpr, WITH_GRAD: tl.constexpr, BLOCK_V: tl.constexpr,
):
    """Mirrors one row of ``dspark.reference.loss.dspark_loss``; overwrites the draft row with its gradient."""
    row = tl.program_id(0).to(tl.int64)
    draft_row = draft_ptr + row * stride_d
    target_row = target_ptr + row * stride_t
    label = tl.load(labels_ptr + row).to(tl.int64)
    max_d = tl.full([], float("-inf"), tl.float32)
    max_t = tl.full([], float("-inf"), tl.float32)
    sum_d = tl.full([], 0.0, tl.float32)
    sum_t = tl.full([], 0.0, tl.float32)
    for v0 in range(0, vocab, BLOCK_V):
        offs = v0 + tl.arange(0, BLOCK_V)
        mask = offs < vocab
        xd = tl.load(draft_row + offs, mask=mask, other=float("-inf")).to(tl.float32)
        xt = tl.load(target_row + offs, mask=mask, other=float("-inf")).to(tl.float32)
        new_d = tl.maximum(max_d, tl.max(xd, 0))
        new_t = tl.maximum(max_t, tl.max(xt, 0))
        sum_d = sum_d * tl.exp(max_d - new_d) + tl.sum(tl.exp(xd - new_d), 0)
        sum_t = sum_t * tl.exp(max_t - new_t) + tl.sum(tl.exp(xt - new_t), 0)
        max_d, max_t = new_d, new_t
    label_logit = tl.load(draft_row + label).to(tl.float32)
    ce = tl.log(sum_d) + max_d - label_logit
    l1_acc = tl.zeros([BLOCK_V], tl.float32)
    s_acc = tl.zeros([BLOCK_V], tl.float32)
    for v0 in range(0, vocab, BLOCK_V):
        offs = v0 + tl.arange(0, BLOCK_V)
        mask = offs < vocab
        pd, pt = _row_probs(draft_row, target_row, offs, mask, max_d, sum_d, max_t, sum_t)
        diff = pd - pt
        l1_acc += tl.abs(diff)
        s_acc += tl.where(diff > 0, pd, tl.where(diff < 0, -pd, 0.0))
    l1 = tl.sum(l1_acc, 0)
    s = tl.sum(s_acc, 0)
    accept = tl.minimum(tl.maximum(1.0 - 0.5 * l1, 0.0), 1.0)
    coef = tl.load(coef_ptr + row).to(tl.float32)
    bce = tl.full([], 0.0, tl.float32)
    if HAS_CONF:
        z = tl.load(z_ptr + row).to(tl.float32)
        softplus = tl.maximum(z, 0.0) + tl.log(1.0 + tl.exp(-tl.abs(z)))
        bce = softplus - accept * z
        if WITH_GRAD:
            tl.store(grad_z_ptr + row, coef * conf_weight * (tl.sigmoid(z) - accept))
    tl.store(ce_ptr + row, ce)
    tl.store(l1_ptr + row, l1)
    tl.store(accept_ptr + row, accept)
    tl.store(bce_ptr + row, bce)
    if WITH_GRAD:
        for v0 in range(0, vocab, BLOCK_V):
            offs = v0 + tl.arange(0, BLOCK_V)
            mask = offs < vocab
            pd, pt = _row_probs(draft_row, target_row, offs, mask, max_d, sum_d, max_t, sum_t)
            diff = pd - pt
            sign = tl.where(diff > 0, 1.0, tl.where(diff < 0, -1.0, 0.0))
            onehot = tl.where(offs == label, 1.0, 0.0)
            grad = coef * (ce_weight * (pd - onehot) + l1_weight * pd * (sign - s))
            tl.store(draft_row + offs, grad, mask=mask)


def _grad_product(grad: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """``grad @ table`` in fp32, on 16-bit operands when ``table`` is 16-bit (as autograd runs that product)."""
    if table.dtype in (torch.bfloat16, torch.float16):
        return (grad.to(table.dtype) @ table).float()
    return grad @ table.float()


class FusedDSparkLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, markov_emb, markov_w2, confidence_logits, lm_head, target_hidden, target_lm_head,
                labels, coef, weights_ce_l1_conf, chunk_rows):
        ce_weight, l1_weight, conf_weight = weights_ce_l1_conf
        rows, device = hidden.shape[0], hidden.device
        vocab = lm_head.shape[0]
        with_grad = any(t is not None and t.requires_grad for t in (hidden, markov_emb, markov_w2, confidence_logits))
        has_markov, has_conf = markov_emb is not None, confidence_logits is not None
        stats = empty_output(4, rows, dtype=torch.float32, device=device)  # ce, l1, c*, bce
        grads = {
            "hidden": torch.zeros_like(hidden, dtype=torch.float32) if with_grad else None,
            "emb": torch.zeros_like(markov_emb, dtype=torch.float32) if with_grad and has_markov else None,
            "w2": torch.zeros_like(markov_w2, dtype=torch.float32) if with_grad and has_markov else None,
            "z": torch.zeros(rows, dtype=torch.float32, device=device) if with_grad and has_conf else None,
        }
        step = chunk_rows or default_chunk_rows(rows, vocab)
        for start in range(0, rows, step):
            sl = slice(start, min(start + step, rows))
            draft = vocab_product(hidden[sl].detach(), lm_head)
            if has_markov:
                emb = markov_emb[sl].detach()
                draft += vocab_product(emb, markov_w2)
            target = vocab_product(target_hidden[sl].detach(), target_lm_head)
            grad_z = grads["z"][sl] if grads["z"] is not None else stats[0, sl]
            args = (
                draft, target, labels[sl].contiguous(), coef[sl].contiguous(),
                confidence_logits[sl].detach().float().contiguous() if has_conf else stats[0, sl],
                stats[0, sl], stats[1, sl], stats[2, sl], stats[3, sl], grad_z,
                vocab, draft.stride(0), target.stride(0), ce_weight, l1_weight, conf_weight,
            )
            # The kernel overwrites the draft logits with their gradient, so it cannot be relaunched to time it.
            launch("dspark_loss", _loss_rows_kernel, (draft.shape[0],), args,
                   dict(HAS_CONF=has_conf, WITH_GRAD=with_grad), device=device, table=CONFIGS, key=(vocab,),
                   tunable=False)
            if with_grad:  # draft now holds d loss / d draft logits for these rows
                grads["hidden"][sl] = _grad_product(draft, lm_head)
                if has_markov:
                    grads["emb"][sl] = _grad_product(draft, markov_w2)
                    grads["w2"] += _grad_product(draft.T, emb)
        ctx.grads = grads
        ctx.dtypes = (hidden.dtype, None if markov_emb is None else markov_emb.dtype,
                      None if markov_w2 is None else markov_w2.dtype,
                      None if confidence_logits is None else confidence_logits.dtype)
        ce, l1, accept, bce = stats
        loss = (coef * (ce_weight * ce + l1_weight * l1 + conf_weight * bce)).sum()
        ctx.mark_non_differentiable(stats)
        return loss, stats

    @staticmethod
    def backward(ctx, grad_loss, _grad_stats):
        g = ctx.grads
        out = []
        for key, dtype in zip(("hidden", "emb", "w2", "z"), ctx.dtypes):
            out.append(None if g[key] is None else (g[key] * grad_loss).to(dtype))
        return (*out, None, None, None, None, None, None, None)


def fused_dspark_loss(hidden, lm_head, target_hidden, target_lm_head, labels, weights, markov_emb, markov_w2,
                      confidence_logits, normalizer, *, ce_weight, l1_weight, confidence_weight, chunk_rows=None):
    """Triton launcher with the signature of ``dspark.loss.dspark_loss`` (inputs validated there)."""
    if lm_head.requires_grad or target_lm_head.requires_grad:
        raise ValueError("the fused DSpark loss treats lm_head and the target as frozen; detach them first")
    norm = normalizer.to(hidden.device, torch.float32)
    coef = (weights.float() / norm).contiguous()
    loss, stats = FusedDSparkLoss.apply(
        hidden, markov_emb, markov_w2, confidence_logits, lm_head, target_hidden, target_lm_head,
        labels, coef, (ce_weight, l1_weight, confidence_weight), chunk_rows,
    )
    ce, l1, accept, bce = stats
    return LossOutput(loss, (coef * ce).sum(), (coef * l1).sum(), (coef * bce).sum(), accept)
