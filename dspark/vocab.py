"""Reduced draft vocabularies (method.md §4.1, §10): the drafter's LM head and W2 cover only frequent tokens.

``draft_to_target [V_draft]`` lists, in increasing order, the target ids the drafter can propose. W1 still
indexes the whole target vocabulary (the previous token may be anything the target emitted). The
speculators format stores the same map as offsets, ``d2t[i] = draft_to_target[i] − i``, and a boolean
``t2d [V]`` marking the target ids that have a draft id.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch


def token_counts(sequences: Iterable[torch.Tensor], vocab_size: int) -> torch.Tensor:
    """``[V]`` occurrence counts of every token id over ``sequences``."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for seq in sequences:
        counts += torch.bincount(seq.flatten().long(), minlength=vocab_size)[:vocab_size]
    return counts


def build_draft_vocab(counts: torch.Tensor, draft_vocab_size: int, always: Iterable[int] = ()) -> torch.Tensor:
    """The ``draft_vocab_size`` most frequent ids (ties: lower id first), plus ``always`` (e.g. EOS), sorted."""
    vocab = counts.shape[0]
    if not 0 < draft_vocab_size <= vocab:
        raise ValueError(f"draft_vocab_size must lie in [1, {vocab}], got {draft_vocab_size}")
    always = sorted(set(int(t) for t in always))
    if len(always) > draft_vocab_size:
        raise ValueError(f"{len(always)} required tokens do not fit a draft vocabulary of {draft_vocab_size}")
    score = counts.double().clone()
    score[always] = float("inf")
    order = torch.sort(-score, stable=True).indices  # stable: equal counts keep increasing ids
    return order[:draft_vocab_size].sort().values


def d2t_offsets(draft_to_target: torch.Tensor) -> torch.Tensor:
    return draft_to_target - torch.arange(draft_to_target.shape[0], device=draft_to_target.device)


def t2d_mask(draft_to_target: torch.Tensor, vocab_size: int) -> torch.Tensor:
    mask = torch.zeros(vocab_size, dtype=torch.bool, device=draft_to_target.device)
    mask[draft_to_target] = True
    return mask


def target_to_draft(draft_to_target: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """``[V]`` draft id of each target id, −1 where the draft vocabulary lacks it."""
    index = torch.full((vocab_size,), -1, dtype=torch.long, device=draft_to_target.device)
    index[draft_to_target] = torch.arange(draft_to_target.shape[0], device=draft_to_target.device)
    return index
