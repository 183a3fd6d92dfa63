"""Sequential logit-bias heads (method.md §4): vanilla Markov, gated Markov and RNN.

The backbone drafts every slot in parallel; these heads restore the dependence of slot k on the token
drafted at slot k−1 with a bias added to the base logits, ``p_k = softmax(U_k + B_k)``. Each ``p_k`` is an
exact local softmax, which is what keeps rejection sampling lossless.

Two uses:
* training, teacher-forced: ``prev_ids = [anchor, x_1, …, x_{γ−1}]`` from the ground truth (method.md §4.3);
* inference, left to right: slot k's bias reads the token just sampled at slot k−1 (method.md §4.2).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from dspark._checks import check_once, check_sampling, check_tensor, check_token_range, check_uniforms
from dspark.backend import resolve_backend
from dspark.config import MARKOV_HEAD_TYPES
from dspark.linear import Linear
from dspark.sampling import sample_from_probs, warp_logits


class MarkovWeights(NamedTuple):
    """The tensors of a sequential head, as the functional ops take them.

    ``w1`` ``[V, r]`` embeds the previous token (target vocabulary); ``w2`` ``[V_draft, r]`` maps to draft
    logits; ``gate_weight [r, d+r]``/``gate_bias [r]`` only for ``gated`` (input ``[h; W1[x]]``);
    ``joint_weight [3r, 2r+d]``/``joint_bias [3r]`` only for ``rnn`` (input ``[s; W1[x]; h]``).
    """

    head_type: str
    w1: torch.Tensor
    w2: torch.Tensor
    gate_weight: torch.Tensor | None = None
    gate_bias: torch.Tensor | None = None
    joint_weight: torch.Tensor | None = None
    joint_bias: torch.Tensor | None = None

    @property
    def rank(self) -> int:
        return self.w1.shape[1]


def markov_feature_step(
    weights: MarkovWeights,
    prev_ids: torch.Tensor,
    hidden: torch.Tensor,
    state: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The rank-r feature e of one slot, whose bias is ``e @ W2ᵀ``.

    vanilla: ``e = W1[x]``; gated: ``e = σ(W_g[h; W1[x]] + b_g) ⊙ W1[x]``; rnn: ``e = tanh(out)`` of eq. 6.

    Args:
        prev_ids: ``[N]`` previous tokens in the target vocabulary.
        hidden: ``[N, d]`` the slot's backbone hidden state (read by gated and rnn heads).
        state: ``[N, r]`` the RNN state ``s_{k−1}`` (``None`` for the first slot, meaning zeros).

    Returns:
        ``(feature [N, r], new_state)``; ``new_state`` is ``None`` for stateless heads.
    """
    # Rows are gathered before any upcast, so a half-precision table is never converted whole.
    emb = weights.w1[prev_ids].to(torch.promote_types(weights.w1.dtype, hidden.dtype))
    if weights.head_type == "vanilla":
        return emb, None
    if weights.head_type == "gated":
        gate = torch.sigmoid(torch.cat([hidden, emb], -1) @ weights.gate_weight.T + weights.gate_bias)
        return gate * emb, None
    if state is None:
        state = emb.new_zeros(emb.shape)
    joint = torch.cat([state, emb, hidden], -1) @ weights.joint_weight.T + weights.joint_bias
    gate, cand, out = joint.chunk(3, dim=-1)
    gate = torch.sigmoid(gate)
    new_state = gate * state + (1 - gate) * torch.tanh(cand)
    # The bias reads s_{k-1} (through z_k), not the state it just produced.
    return torch.tanh(out), new_state


def markov_step(weights: MarkovWeights, prev_ids: torch.Tensor, hidden: torch.Tensor, state: torch.Tensor | None):
    """``(bias [N, V_draft], new_state)`` of one slot; see :func:`markov_feature_step`."""
    feature, state = markov_feature_step(weights, prev_ids, hidden, state)
    return feature @ weights.w2.T, state


def teacher_forced_features(weights: MarkovWeights, prev_ids: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
    """Markov features ``[..., γ, r]`` of whole blocks given the previous tokens (bias = features @ W2ᵀ).

    Args:
        prev_ids: ``[..., γ]`` target-vocabulary ids ``[x_0 (anchor), x_1, …, x_{γ−1}]``.
        hidden: ``[..., γ, d]`` backbone hidden states.
    """
    _check_weights(weights, hidden.shape[-1])
    check_tensor("prev_ids", prev_ids, integer=True)
    check_tensor("hidden", hidden, ndim=prev_ids.ndim + 1, floating=True)
    if hidden.shape[:-1] != prev_ids.shape:
        raise ValueError(f"hidden {tuple(hidden.shape)} must be prev_ids {tuple(prev_ids.shape)} plus a hidden dim")
    check_token_range("prev_ids", prev_ids, weights.w1.shape[0])
    if weights.head_type != "rnn":
        flat = markov_feature_step(weights, prev_ids.reshape(-1), hidden.reshape(-1, hidden.shape[-1]), None)[0]
        return flat.reshape(*prev_ids.shape, -1)
    gamma = prev_ids.shape[-1]
    flat_ids = prev_ids.reshape(-1, gamma)
    flat_hidden = hidden.reshape(-1, gamma, hidden.shape[-1])
    state = None
    features = []
    for k in range(gamma):
        feature, state = markov_feature_step(weights, flat_ids[:, k], flat_hidden[:, k], state)
        features.append(feature)
    return torch.stack(features, 1).reshape(*prev_ids.shape, -1)


def teacher_forced_bias(weights: MarkovWeights, prev_ids: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
    """Markov bias ``[..., γ, V_draft]`` for whole blocks at once (method.md §4.3 teacher forcing).

    Args:
        prev_ids: ``[..., γ]`` target-vocabulary ids ``[x_0 (anchor), x_1, …, x_{γ−1}]``.
        hidden: ``[..., γ, d]`` backbone hidden states.
    """
    return teacher_forced_features(weights, prev_ids, hidden) @ weights.w2.T


def sample_block(
    base_logits: torch.Tensor,
    hidden: torch.Tensor,
    anchor_ids: torch.Tensor,
    uniforms: torch.Tensor,
    weights: MarkovWeights | None,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    draft_to_target: torch.Tensor | None = None,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draft a block left to right: slot k samples from ``warp(U_k + B_k(x_{k−1}))`` (method.md §4.2).

    Args:
        base_logits: ``[R, γ, V_draft]`` backbone logits ``U``.
        hidden: ``[R, γ, d]`` backbone hidden states (used by gated and rnn heads).
        anchor_ids: ``[R]`` the anchors ``x_0`` (target vocabulary), the previous token of slot 1.
        uniforms: ``[R, γ]`` one draw in ``[0, 1)`` per slot (ignored when greedy).
        weights: the sequential head, or ``None`` for no bias (the DFlash baseline).
        temperature, top_k, top_p: as in :func:`dspark.sampling.warp_logits`; ``temperature=0`` is greedy.
        draft_to_target: ``[V_draft]`` int64 map from draft ids to target ids, for a reduced draft vocabulary.
        backend: ``auto`` | ``reference`` | ``torch`` | ``triton``.

    Returns:
        ``(tokens [R, γ] int64 in the draft vocabulary, draft_probs [R, γ, V_draft])``: the distribution
        each token was actually drawn from, which the verifier needs.
    """
    check_once(_check_sample_block_inputs, base_logits, hidden, anchor_ids, uniforms, weights, draft_to_target,
               temperature, top_k, top_p)
    explicit = backend == "triton"
    backend = resolve_backend(backend, base_logits)
    if backend == "triton" and not explicit and weights is not None and weights.head_type != "vanilla":
        backend = "torch"  # the fused sampler covers vanilla heads only (kernels/markov.py says why)
    if backend == "reference":
        from dspark.reference.markov import sample_block as reference_sample_block

        return reference_sample_block(
            base_logits, hidden, anchor_ids, uniforms, weights,
            temperature=temperature, top_k=top_k, top_p=top_p, draft_to_target=draft_to_target,
        )
    if backend == "triton":
        from dspark.kernels import markov_sample_block

        return markov_sample_block(
            base_logits, hidden, anchor_ids, uniforms, weights,
            temperature=temperature, top_k=top_k, top_p=top_p, draft_to_target=draft_to_target,
        )
    # Half-precision inputs are upcast once, as the kernel upcasts after every load: the bias and its sum
    # with the base logits must not be rounded to bf16 before the softmax.
    compute = torch.promote_types(base_logits.dtype, torch.float32)
    base_logits, hidden = base_logits.to(compute), hidden.to(compute)
    if weights is not None:  # W1 too large to upcast whole: markov_feature_step upcasts the rows it gathers
        weights = weights._replace(**{name: value.to(compute) for name, value in weights._asdict().items()
                                      if isinstance(value, torch.Tensor) and name != "w1"})
    if temperature == 0:
        return _greedy_block(base_logits, hidden, anchor_ids, weights, draft_to_target)
    probs = []

    def sample(k: int, logits: torch.Tensor) -> torch.Tensor:
        probs.append(warp_logits(logits, temperature, top_k, top_p))
        return sample_from_probs(probs[-1], uniforms[:, k].to(probs[-1].dtype))

    tokens = _left_to_right(base_logits, hidden, anchor_ids, weights, draft_to_target, sample)
    return tokens, torch.stack(probs, 1)


def _left_to_right(base_logits, hidden, anchor_ids, weights, draft_to_target, choose) -> torch.Tensor:
    """Tokens ``[R, γ]`` chosen slot by slot: ``choose(k, U_k + B_k(x_{k−1}))`` returns slot k's tokens ``[R]``,
    whose target ids become the previous tokens of slot k + 1."""
    prev = anchor_ids
    state = None
    tokens = []
    for k in range(base_logits.shape[1]):
        logits = base_logits[:, k]
        if weights is not None:
            bias, state = markov_step(weights, prev, hidden[:, k], state)
            logits = logits + bias
        tokens.append(choose(k, logits))
        prev = tokens[-1] if draft_to_target is None else draft_to_target[tokens[-1]]
    return torch.stack(tokens, 1)


def _greedy_block(base_logits, hidden, anchor_ids, weights, draft_to_target):
    """:func:`sample_block` at temperature 0: each slot takes the first argmax of ``U_k + B_k``, and its
    distribution is the one-hot that ``warp_logits`` would return (whose inverse CDF is that argmax whatever
    the draw). The one-hots are built, and the maxima checked, once for the whole block, so that the loop over
    slots does no more than the biases and the argmaxes."""
    tops = []

    def argmax(k: int, logits: torch.Tensor) -> torch.Tensor:
        top, token = logits.max(-1)
        tops.append(top)
        return token

    tokens = _left_to_right(base_logits, hidden, anchor_ids, weights, draft_to_target, argmax)
    # max propagates NaN and finds +inf, so finite maxima are the check warp_logits makes of every logit; a
    # non-finite slot can only have steered the slots after it, and the whole block is refused.
    check_tensor("draft logits", torch.stack(tops, 1), finite=True)
    # A scatter, not one_hot: one_hot reads the tokens' range back to the host to check it.
    probs = torch.zeros_like(base_logits).scatter_(-1, tokens[..., None], 1)
    return tokens, probs


def previous_tokens(anchor_ids: torch.Tensor, tokens: torch.Tensor, draft_to_target: torch.Tensor | None = None):
    """``[R, γ]`` previous token of every slot in the target vocabulary: ``[x_0, x_1, …, x_{γ−1}]``."""
    prev = tokens[:, :-1] if draft_to_target is None else draft_to_target[tokens[:, :-1]]
    return torch.cat([anchor_ids[:, None], prev], 1)


class MarkovHead(nn.Module):
    """Sequential head with speculators' tensor names (``markov_w1``, ``markov_w2``, ``gate_proj``, ``joint_proj``).

    Args:
        vocab_size: V, rows of ``markov_w1`` (the target vocabulary, even with a reduced draft vocabulary).
        draft_vocab_size: V_draft, outputs of ``markov_w2``.
        rank: r.
        head_type: ``vanilla`` | ``gated`` | ``rnn``.
        hidden_size: d (gated and rnn read the backbone hidden state).
    """

    def __init__(self, vocab_size: int, draft_vocab_size: int, rank: int, head_type: str, hidden_size: int):
        super().__init__()
        if head_type not in MARKOV_HEAD_TYPES:
            raise ValueError(f"head_type must be one of {MARKOV_HEAD_TYPES}, got {head_type!r}")
        if rank < 1:
            raise ValueError(f"a Markov head needs rank >= 1, got {rank}")
        self.head_type = head_type
        self.markov_w1 = nn.Embedding(vocab_size, rank)
        self.markov_w2 = Linear(rank, draft_vocab_size, bias=False)
        if head_type == "gated":
            self.gate_proj = Linear(hidden_size + rank, rank)
        if head_type == "rnn":
            self.joint_proj = Linear(2 * rank + hidden_size, 3 * rank)

    def weights(self) -> MarkovWeights:
        gate = getattr(self, "gate_proj", None)
        joint = getattr(self, "joint_proj", None)
        return MarkovWeights(
            self.head_type,
            self.markov_w1.weight,
            self.markov_w2.weight,
            gate.weight if gate is not None else None,
            gate.bias if gate is not None else None,
            joint.weight if joint is not None else None,
            joint.bias if joint is not None else None,
        )

    def forward(self, prev_ids: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """Teacher-forced bias ``[..., γ, V_draft]``; see :func:`teacher_forced_bias`."""
        return teacher_forced_bias(self.weights(), prev_ids, hidden)

    def features(self, prev_ids: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """Teacher-forced features ``[..., γ, r]`` (bias = features @ W2ᵀ); see :func:`teacher_forced_features`."""
        return teacher_forced_features(self.weights(), prev_ids, hidden)


def _check_weights(weights: MarkovWeights, hidden_size: int) -> None:
    if weights.head_type not in MARKOV_HEAD_TYPES:
        raise ValueError(f"head_type must be one of {MARKOV_HEAD_TYPES}, got {weights.head_type!r}")
    rank = weights.rank
    check_tensor("w1", weights.w1, ndim=2, floating=True)
    check_tensor("w2", weights.w2, shape=(None, rank), floating=True)
    if weights.head_type == "gated":
        check_tensor("gate_weight", weights.gate_weight, shape=(rank, hidden_size + rank), floating=True)
        check_tensor("gate_bias", weights.gate_bias, shape=(rank,), floating=True)
    if weights.head_type == "rnn":
        check_tensor("joint_weight", weights.joint_weight, shape=(3 * rank, 2 * rank + hidden_size), floating=True)
        check_tensor("joint_bias", weights.joint_bias, shape=(3 * rank,), floating=True)


def _check_sample_block_inputs(base_logits, hidden, anchor_ids, uniforms, weights, draft_to_target, temperature,
                               top_k, top_p) -> None:
    check_tensor("base_logits", base_logits, ndim=3, floating=True, finite=True)
    num_requests, gamma, draft_vocab = base_logits.shape
    check_sampling(temperature, top_k, top_p, draft_vocab)
    check_tensor("hidden", hidden, shape=(num_requests, gamma, None), floating=True, finite=True)
    check_tensor("anchor_ids", anchor_ids, shape=(num_requests,), integer=True)
    check_tensor("uniforms", uniforms, shape=(num_requests, gamma), floating=True)
    check_uniforms("uniforms", uniforms)
    if draft_to_target is not None:
        check_tensor("draft_to_target", draft_to_target, shape=(draft_vocab,), integer=True)
    if weights is not None:
        _check_weights(weights, hidden.shape[-1])
        if weights.w2.shape[0] != draft_vocab:
            raise ValueError(
                f"vocabulary mismatch: base_logits have {draft_vocab} draft logits but w2 outputs {weights.w2.shape[0]}"
            )
        if draft_to_target is None and weights.w1.shape[0] != draft_vocab:
            raise ValueError(
                f"w1 indexes {weights.w1.shape[0]} target tokens but the draft vocabulary has {draft_vocab}: "
                "pass draft_to_target to map draft ids into the target vocabulary"
            )
        check_token_range("anchor_ids", anchor_ids, weights.w1.shape[0])
        if draft_to_target is not None:  # it maps drafted ids to the previous tokens W1 embeds
            check_token_range("draft_to_target", draft_to_target, weights.w1.shape[0])
