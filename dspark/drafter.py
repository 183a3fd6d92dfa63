"""DSparkDrafter: the backbone, the sequential head and the confidence head as one module (method.md §1)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dspark._checks import check_tensor
from dspark.backbone import BlockBackbone, ContextCache
from dspark.confidence import ConfidenceHead, confidence_survival
from dspark.config import DSparkConfig
from dspark.markov import MarkovHead, previous_tokens, sample_block


@dataclass
class DraftOutput:
    """One drafted block per request.

    Attributes:
        tokens: ``[R, γ]`` drafted tokens as target ids (mapped from a reduced draft vocabulary).
        draft_probs: ``[R, γ, V]`` the distributions they were sampled from, over the target vocabulary
            (zero outside a reduced draft vocabulary).
        confidence_logits, confidence, survival: ``[R, γ]``, or ``None`` without a confidence head.
    """

    tokens: torch.Tensor
    draft_probs: torch.Tensor
    confidence_logits: torch.Tensor | None = None
    confidence: torch.Tensor | None = None
    survival: torch.Tensor | None = None


class DSparkDrafter(BlockBackbone):
    """A DSpark drafter. Its ``state_dict`` uses speculators' tensor names (method.md §10).

    With ``markov_rank=0`` and no confidence head it is DeepSpec's DFlash baseline (method.md §2.1).
    """

    def __init__(self, config: DSparkConfig):
        super().__init__(config)
        if config.has_markov:
            self.markov_head = MarkovHead(
                config.vocab_size, config.draft_vocab_size, config.markov_rank, config.markov_head_type,
                config.hidden_size,
            )
        if config.enable_confidence_head:
            rank = config.markov_rank if config.confidence_head_with_markov else 0
            self.confidence_head = ConfidenceHead(config.hidden_size, rank, bias=config.confidence_head_bias)
        self.register_buffer("sts_temperatures", torch.ones(config.block_size), persistent=True)
        if self.reduced_vocab:
            self.register_buffer("draft_to_target", torch.arange(config.draft_vocab_size), persistent=True)
        self.init_weights()

    @property
    def reduced_vocab(self) -> bool:
        return self.config.draft_vocab_size < self.config.vocab_size

    @torch.no_grad()
    def set_draft_vocab(self, draft_to_target: torch.Tensor, target_lm_head: torch.Tensor | None = None) -> None:
        """Install the target ids ``[V_draft]`` of the draft vocabulary (see :mod:`dspark.vocab`) and, given the
        target's full LM head ``[V, d]``, the matching rows of ``lm_head``."""
        if not self.reduced_vocab:
            raise ValueError("this drafter's config has no reduced draft vocabulary (draft_vocab_size == vocab_size)")
        check_tensor("draft_to_target", draft_to_target, shape=(self.config.draft_vocab_size,), integer=True)
        ids = draft_to_target.to(self.draft_to_target.device)
        if bool((ids[1:] <= ids[:-1]).any()) or int(ids.min()) < 0 or int(ids.max()) >= self.config.vocab_size:
            raise ValueError("draft_to_target must hold increasing target ids in range")
        self.draft_to_target.copy_(ids)
        if target_lm_head is not None:
            self.lm_head.weight.copy_(target_lm_head[ids.to(target_lm_head.device)])

    @torch.no_grad()
    def load_target_embeddings(self, embed_weight: torch.Tensor, lm_head_weight: torch.Tensor) -> None:
        """Copy the target's embedding ``[V, d]`` and LM head (``[V, d]``; rows of the draft vocabulary are
        selected when it is reduced)."""
        if self.reduced_vocab and lm_head_weight.shape[0] == self.config.vocab_size:
            lm_head_weight = lm_head_weight[self.draft_to_target.to(lm_head_weight.device)]
        super().load_target_embeddings(embed_weight, lm_head_weight)

    @torch.no_grad()
    def init_weights(self, std: float = 0.02) -> None:
        """Hugging Face's ``post_init`` rule: N(0, std²) weights, zero biases, unit norms.

        The frozen embedding and LM head are meant to be overwritten by the target's
        (:meth:`load_target_embeddings`).
        """
        for name, param in self.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            elif name.endswith(".bias"):
                param.zero_()
            else:
                param.normal_(0.0, std)

    def training_outputs(
        self,
        anchor_ids: torch.Tensor,
        anchor_pos: torch.Tensor,
        tap_features: torch.Tensor,
        next_ids: torch.Tensor,
        block_valid: torch.Tensor | None = None,
        *,
        backend: str = "auto",
        dropout: float = 0.0,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """Teacher-forced hidden states, Markov features and confidence logits of many blocks (method.md §4.3).

        Args:
            anchor_ids, anchor_pos, tap_features, block_valid, dropout: as :meth:`BlockBackbone.forward`.
            next_ids: ``[B, N, γ−1]`` the ground-truth tokens ``x_1 … x_{γ−1}`` after each anchor, which
                become the previous tokens of slots 2…γ.

        Returns:
            ``(hidden [B, N, γ, d], markov_features [B, N, γ, r] or None, confidence_logits [B, N, γ] or None)``;
            the draft logits are ``lm_head(hidden) + markov_features @ W2ᵀ``.
        """
        gamma = self.config.block_size
        check_tensor("next_ids", next_ids, shape=(*anchor_ids.shape, gamma - 1), integer=True)
        hidden = self(anchor_ids, anchor_pos, tap_features, block_valid, backend=backend, dropout=dropout)
        prev_ids = torch.cat([anchor_ids[..., None], next_ids], -1)
        features = self.markov_head.features(prev_ids, hidden) if self.config.has_markov else None
        confidence_logits = None
        if self.config.enable_confidence_head:
            prev_emb = self.markov_head.markov_w1(prev_ids) if self.confidence_head.markov_rank else None
            confidence_logits = self.confidence_head(hidden, prev_emb)
        return hidden, features, confidence_logits

    def training_logits(self, anchor_ids, anchor_pos, tap_features, next_ids, block_valid=None, *, backend="auto"):
        """``(draft_logits [B, N, γ, V_draft] = U + B, confidence_logits or None)``; see :meth:`training_outputs`."""
        hidden, features, confidence_logits = self.training_outputs(
            anchor_ids, anchor_pos, tap_features, next_ids, block_valid, backend=backend)
        logits = self.lm_head(hidden)
        if features is not None:
            logits = logits + features @ self.markov_head.markov_w2.weight.T
        return logits, confidence_logits

    @torch.no_grad()
    def draft(
        self,
        anchor_ids: torch.Tensor,
        cache: ContextCache,
        uniforms: torch.Tensor,
        *,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        backend: str = "auto",
        context_rows: int | None = None,
    ) -> DraftOutput:
        """Draft one block per request over its context cache (method.md §1 steps 1–3).

        Args:
            anchor_ids: ``[R]`` current anchors.
            cache: context cache holding the fused target features of every position before the anchor.
            uniforms: ``[R, γ]`` draws in ``[0, 1)`` for the block sampler.
            context_rows: cache rows attention reads per request; see :meth:`BlockBackbone.forward_cached`.
        """
        hidden = self.forward_cached(anchor_ids, cache, backend=backend, context_rows=context_rows)
        base_logits = self.lm_head(hidden)
        weights = self.markov_head.weights() if self.config.has_markov else None
        mapping = self.draft_to_target if self.reduced_vocab else None
        tokens, draft_probs = sample_block(
            base_logits, hidden, anchor_ids, uniforms, weights,
            temperature=temperature, top_k=top_k, top_p=top_p, draft_to_target=mapping, backend=backend,
        )
        if mapping is not None:  # hand the verifier target ids and distributions over the target vocabulary
            tokens = mapping[tokens]
            full = draft_probs.new_zeros(*draft_probs.shape[:2], self.config.vocab_size)
            draft_probs = full.index_copy_(-1, mapping, draft_probs)
        out = DraftOutput(tokens, draft_probs)
        if self.config.enable_confidence_head:
            head = self.confidence_head
            out.confidence_logits, out.confidence, out.survival = confidence_survival(
                hidden,
                head.proj.weight,
                head.proj.bias,
                previous_tokens(anchor_ids, tokens) if head.markov_rank else None,
                self.markov_head.markov_w1.weight if head.markov_rank else None,
                self.sts_temperatures,
                backend=backend,
            )
        return out
