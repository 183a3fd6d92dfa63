"""What one training step computes: its blocks stacked into one batch, and the drafter with its loss as one module.

:func:`prepare_blocks` cuts the blocks of all of a step's sequences into one :class:`BlockBatch` (contexts
padded to the longest); :class:`TrainingLoss` runs the drafter and its objective over that batch in one
forward, which is the module DDP or FSDP2 wrap. The eagle3 objective trains on :class:`Chains` instead.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from dspark.drafter import DSparkDrafter
from dspark.loss import dspark_loss, position_weights, vocab_product
from dspark.train.config import TrainConfig
from dspark.train.samples import Sample, block_targets, sample_anchors


@dataclass
class BlockBatch:
    """The blocks of one step: ``N`` anchors in each of ``B`` sequences, contexts padded to the longest.

    ``anchor_ids, anchor_pos [B, N]``, ``block_valid [B, N]`` bool, ``taps [B, S, taps·H_t]``,
    ``labels, weights [B, N, γ]``, ``next_ids [B, N, γ−1]`` and ``target_hidden [B, N, γ, H_t]``.
    """

    anchor_ids: torch.Tensor
    anchor_pos: torch.Tensor
    block_valid: torch.Tensor
    taps: torch.Tensor
    labels: torch.Tensor
    next_ids: torch.Tensor
    weights: torch.Tensor
    target_hidden: torch.Tensor

    def to(self, device: torch.device) -> BlockBatch:
        return BlockBatch(*(getattr(self, f.name).to(device) for f in fields(self)))


def prepare_blocks(samples: list[Sample], features: list[tuple[torch.Tensor, torch.Tensor]], block_size: int,
                   num_anchors: int, decay: float, generators: list[torch.Generator],
                   length_bucket: int = 1) -> BlockBatch:
    """Cut the blocks of several sequences and stack them into one :class:`BlockBatch`.

    Each sequence draws its anchors from its own generator, so its blocks do not depend on which sequences
    share its step or its rank. Sequences are padded at the end to the longest (rounded up to a multiple of
    ``length_bucket``): padded context rows are zeros that no block sees (block n attends to rows before its
    anchor only) and padded positions are outside the loss mask, so they are never labels.
    """
    longest = -(-max(s.token_ids.shape[0] for s in samples) // length_bucket) * length_bucket
    taps0, hidden0 = features[0]
    token_ids = torch.zeros(len(samples), longest, dtype=torch.long)
    loss_mask = torch.zeros(len(samples), longest, dtype=torch.bool)
    taps = taps0.new_zeros(len(samples), longest, taps0.shape[-1])
    hidden = hidden0.new_zeros(len(samples), longest, hidden0.shape[-1])
    anchors = []
    for b, (sample, (sample_taps, sample_hidden), generator) in enumerate(zip(samples, features, generators)):
        n = sample.token_ids.shape[0]
        token_ids[b, :n], loss_mask[b, :n] = sample.token_ids, sample.loss_mask
        taps[b, :n], hidden[b, :n] = sample_taps, sample_hidden
        anchors.append(sample_anchors(sample.loss_mask, num_anchors, generator))
    anchor_pos = torch.stack([pos for pos, _ in anchors])
    block_valid = torch.stack([valid for _, valid in anchors])
    labels, eval_mask, next_ids, target_index = block_targets(token_ids, loss_mask, anchor_pos, block_valid,
                                                              block_size)
    rows = target_index.flatten(1)[..., None].expand(-1, -1, hidden.shape[-1])
    target_hidden = hidden.gather(1, rows).view(*target_index.shape, hidden.shape[-1])
    return BlockBatch(token_ids.gather(1, anchor_pos), anchor_pos, block_valid, taps, labels, next_ids,
                      position_weights(eval_mask, decay), target_hidden)


@dataclass
class Chains:
    """What the eagle3 objective trains on in one sequence: ``token_ids, loss_mask [S]``, ``taps [S, taps·H_t]``,
    ``hidden [S, H_t]`` (the target's final hidden states) and chain ``anchors [N]``."""

    token_ids: torch.Tensor
    loss_mask: torch.Tensor
    taps: torch.Tensor
    hidden: torch.Tensor
    anchors: torch.Tensor


class TrainingLoss(torch.nn.Module):
    """A drafter and its training objective as one module: what a step calls once, and what DDP or FSDP2 wraps.

    Every drafter weight the loss reads (its LM head, the Markov head's ``W2``) is read inside
    :meth:`forward`, where FSDP2 has gathered the parameters. ``target_lm_head [V_draft, H_t]`` is a plain
    tensor, not a parameter: frozen, replicated and never sharded.
    """

    def __init__(self, drafter: DSparkDrafter, target_lm_head: torch.Tensor, config: TrainConfig,
                 low_precision: bool):
        super().__init__()
        self.drafter = drafter
        self.target_lm_head = target_lm_head
        self.config = config
        self.low_precision = low_precision

    def _autocast(self):
        return torch.autocast(self.target_lm_head.device.type, dtype=torch.bfloat16, enabled=self.low_precision)

    def forward(self, batch: BlockBatch | list[Chains], normalizer: torch.Tensor, *, predictions: bool = False):
        """The loss of a whole step's blocks (or, for eagle3, chains) over the global ``normalizer``.

        Returns a :class:`dspark.loss.LossOutput`, with ``(output, greedy ids [B, N, γ])`` when ``predictions``;
        for eagle3, one :class:`dspark.eagle3.TTTOutput` per sequence.
        """
        if self.config.objective == "eagle3":
            return [self._chains_loss(chains, normalizer, metrics=predictions) for chains in batch]
        with self._autocast():
            hidden, features, conf = self.drafter.training_outputs(
                batch.anchor_ids, batch.anchor_pos, batch.taps, batch.next_ids, batch.block_valid,
                dropout=self.config.dropout)
        d = hidden.shape[-1]
        w2 = self.drafter.markov_head.markov_w2.weight if features is not None else None
        # Cast once per step, not per product: a trainable head still gets its gradient through this one cast.
        lm_head, target_hidden = self.drafter.lm_head.weight, batch.target_hidden
        if self.low_precision:  # the loss runs its vocabulary products on bf16 operands, the rest in fp32
            lm_head, hidden, target_hidden = lm_head.bfloat16(), hidden.bfloat16(), target_hidden.bfloat16()
            if features is not None:
                features, w2 = features.bfloat16(), w2.bfloat16()
        out = dspark_loss(
            hidden.reshape(-1, d), lm_head, target_hidden.reshape(-1, d),
            self.target_lm_head, batch.labels.reshape(-1), batch.weights.reshape(-1),
            markov_emb=None if features is None else features.reshape(-1, features.shape[-1]), markov_w2=w2,
            confidence_logits=None if conf is None or self.config.objective == "dflash" else conf.reshape(-1),
            normalizer=normalizer, chunk_rows=self.config.loss_chunk_rows, backend=self.config.loss_backend,
            **self.config.loss_weights())
        if not predictions:
            return out
        with torch.no_grad():
            logits = self.drafter.lm_head(hidden.to(self.drafter.lm_head.weight.dtype))
            if features is not None:
                logits = logits + features.to(logits.dtype) @ self.drafter.markov_head.markov_w2.weight.T
        return out, logits.argmax(-1)

    def _chains_loss(self, chains: Chains, normalizer: torch.Tensor, metrics: bool):
        with torch.no_grad():
            target_probs = torch.softmax(vocab_product(chains.hidden.to(self.target_lm_head.dtype),
                                                       self.target_lm_head), -1)
        with self._autocast():
            return self.drafter.ttt_loss(chains.token_ids, chains.taps, target_probs, chains.loss_mask,
                                         chains.anchors, normalizer, metrics=metrics)
