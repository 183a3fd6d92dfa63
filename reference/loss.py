"""Oracle for dspark.loss: the DSpark objective row by row, full softmax in float64 (method.md §8)."""

from __future__ import annotations

import torch

from dspark.contract import LossOutput


def dspark_loss(hidden, lm_head, target_hidden, target_lm_head, labels, weights, markov_emb, markov_w2,
                confidence_logits, normalizer, *, ce_weight, l1_weight, confidence_weight):
    """Loss and its parts; differentiable (float64 autograd) through hidden, markov_emb, W2 and z."""
    norm = float(normalizer)
    total = ce_sum = l1_sum = bce_sum = 0.0
    acceptance = []
    for i in range(hidden.shape[0]):
        logits = lm_head.double() @ hidden[i].double()
        if markov_emb is not None:
            logits = logits + markov_w2.double() @ markov_emb[i].double()
        target_logits = (target_lm_head.double() @ target_hidden[i].double()).detach()
        draft_probs = torch.softmax(logits, 0)
        target_probs = torch.softmax(target_logits, 0)
        ce = torch.logsumexp(logits, 0) - logits[int(labels[i])]
        l1 = (draft_probs - target_probs).abs().sum()
        accept = min(max(1 - 0.5 * float(l1.detach()), 0.0), 1.0)
        acceptance.append(accept)
        bce = torch.zeros((), dtype=torch.float64)
        if confidence_logits is not None:
            z = confidence_logits[i].double()
            # log(1 + e^z) as logaddexp: exact, and its derivative is σ(z) everywhere (at z = 0 too, where
            # the usual max(z, 0) + log1p(e^{−|z|}) form has a one-sided gradient of 1).
            bce = torch.logaddexp(z, torch.zeros_like(z)) - accept * z
        w = float(weights[i])
        total = total + w * (ce_weight * ce + l1_weight * l1 + confidence_weight * bce)
        ce_sum += w * float(ce.detach())
        l1_sum += w * float(l1.detach())
        bce_sum += w * float(bce.detach())
    loss = total / norm if torch.is_tensor(total) else torch.tensor(total / norm, dtype=torch.float64)
    parts = [torch.tensor(x / norm, dtype=torch.float64) for x in (ce_sum, l1_sum, bce_sum)]
    return LossOutput(loss, *parts, torch.tensor(acceptance, dtype=torch.float64))
