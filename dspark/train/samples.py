"""Training samples and what a step cuts from them: anchors and block targets (method.md §3).

A :class:`Sample` is a token sequence with a loss mask over the assistant's tokens, answered by the target
itself (on-policy; :mod:`dspark.train.corpus` answers prompts and captures the features in one pass).
Anchors, labels, contiguous-prefix masks and position weights follow method.md §3, §8:
:func:`sample_anchors`, :func:`block_targets`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Sample:
    """One training sequence: ``token_ids [S]`` and ``loss_mask [S]`` (True on the target's answer).

    ``key`` is its index in the dataset it came from, which names its offline feature file; without one,
    the index the trainer sees it under is used.
    """

    token_ids: torch.Tensor
    loss_mask: torch.Tensor
    key: int | None = None

    def __post_init__(self):
        if self.token_ids.ndim != 1 or self.loss_mask.shape != self.token_ids.shape:
            raise ValueError(f"token_ids and loss_mask must be 1-D of equal length, got {tuple(self.token_ids.shape)} "
                             f"and {tuple(self.loss_mask.shape)}")
        self.loss_mask = self.loss_mask.bool()


def sample_anchors(loss_mask: torch.Tensor, num_anchors: int, generator: torch.Generator):
    """Up to ``num_anchors`` distinct anchors, uniformly without replacement, sorted, padded to that count.

    Position p is a valid anchor iff ``loss_mask[p]`` and ``loss_mask[p + 1]``: the anchor and its first
    target both lie in the answer. Returns ``(anchor_pos [N] int64, block_valid [N] bool)``.
    """
    valid = (loss_mask[:-1] & loss_mask[1:]).nonzero().squeeze(1)
    take = min(num_anchors, valid.numel())
    chosen = valid[torch.randperm(valid.numel(), generator=generator)[:take]].sort().values
    anchor_pos = torch.zeros(num_anchors, dtype=torch.long)
    anchor_pos[:take] = chosen
    block_valid = torch.arange(num_anchors) < take
    return anchor_pos, block_valid


def block_targets(token_ids: torch.Tensor, loss_mask: torch.Tensor, anchor_pos: torch.Tensor,
                  block_valid: torch.Tensor, block_size: int):
    """Labels and masks of every block (sample-from-anchor layout, method.md §2.1, §3).

    Slot k (0-based) of the block anchored at a predicts ``x[a + k + 1]`` and is supervised while
    ``a + k + 1 < S`` and ``loss_mask[a + k + 1]`` hold for it and every earlier slot (a contiguous prefix).
    The target distribution of slot k is the target's next-token distribution at position ``a + k``.

    Args:
        token_ids, loss_mask: ``[..., S]``; anchor_pos, block_valid: ``[..., N]`` (leading dims: sequences,
            padded at the end with positions outside the loss mask).

    Returns:
        ``labels [..., N, γ]``, ``eval_mask [..., N, γ]`` bool, ``next_ids [..., N, γ−1]`` (ground truth
        x_1..x_{γ−1}, the previous tokens of slots 2..γ) and ``target_index [..., N, γ]`` (positions of p_t),
        all clamped into range where masked.
    """
    seq_len = token_ids.shape[-1]
    slots = torch.arange(block_size)
    label_index = anchor_pos[..., None] + slots + 1
    in_range = label_index < seq_len
    clamped = label_index.clamp(max=seq_len - 1)

    def at(values: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        return values.gather(-1, index.flatten(-2)).view(index.shape)

    supervised = in_range & at(loss_mask, clamped) & block_valid[..., None]
    eval_mask = supervised.long().cumprod(-1).bool()
    labels = at(token_ids, clamped)
    target_index = (anchor_pos[..., None] + slots).clamp(max=seq_len - 1)
    return labels, eval_mask, labels[..., :-1], target_index
