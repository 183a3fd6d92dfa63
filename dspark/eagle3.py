"""EAGLE-3-style baseline: a one-layer autoregressive drafter trained with unrolled steps (method.md §8.1).

Position t of the draft layer reads ``concat(RMSNorm(embed(x_t)), RMSNorm(h_{t−1}))`` (2d wide) where
``h_{t−1}`` is ``fc(concat(taps))`` of the target at t − 1 for committed positions, or the draft's own
previous output inside a drafted chain. The layer's output ``g_t`` (residual on the hidden stream) gives
``lm_head(norm(g_t))``, the distribution of ``x_{t+1}``. At decode time the drafter samples a chain of γ
tokens one at a time over its own KV cache of committed positions; there is no confidence head, so the
scheduler sees confidence 1 (fixed-length verification).

Training-time test (TTT): step 0 runs every position with the target's features; step i feeds position t
the draft's step-(i−1) output at t − 1, and its query at t attends to step-0 keys at positions ≤ t − i
plus the step-j keys at t − i + j for j = 1 … i: exactly what the chain anchored at t − i sees at its
i-th drafted token. Step i's loss is the soft cross-entropy against the target's next-token distribution
at t; the total is Σ_i 0.8^i · loss_i.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from dspark._checks import check_tensor
from dspark.backbone import ContextCache, RMSNorm, SwiGLU, apply_rope, rope_cos_sin
from dspark.config import DSparkConfig
from dspark.drafter import DraftOutput
from dspark.linear import Linear
from dspark.sampling import sample_from_probs, warp_logits

STEP_DECAY = 0.8


@dataclass
class TTTOutput:
    """What :meth:`Eagle3Drafter.ttt_loss` returns: the loss, the soft-CE sum of each step ``[steps]``, and
    per chain and step ``[N, steps]`` the supervised mask, the accepted probability ``c* = 1 − ½‖p_d − p_t‖₁``
    and the greedy hits (these two ``None`` when the loss was asked for without metrics)."""

    loss: torch.Tensor
    ce_sums: torch.Tensor
    mask: torch.Tensor
    acceptance: torch.Tensor | None = None
    hits: torch.Tensor | None = None

    def tau_prob(self) -> torch.Tensor:
        """``[N]``: 1 + Σ_k Π_{i≤k} c*_i per chain (method.md §8), steps past the supervised prefix counting 0."""
        return 1 + (self.acceptance * self.mask).cumprod(-1).sum(-1)


class Eagle3Layer(nn.Module):
    """One decoder layer whose attention reads the 2d-wide ``[norm(embed) ; norm(hidden)]`` input."""

    def __init__(self, config: DSparkConfig):
        super().__init__()
        self.config = config
        d, hd = config.hidden_size, config.head_dim
        self.input_layernorm = RMSNorm(d, config.rms_norm_eps)
        self.hidden_norm = RMSNorm(d, config.rms_norm_eps)
        self.q_proj = Linear(2 * d, config.num_attention_heads * hd, bias=False)
        self.k_proj = Linear(2 * d, config.num_key_value_heads * hd, bias=False)
        self.v_proj = Linear(2 * d, config.num_key_value_heads * hd, bias=False)
        self.o_proj = Linear(config.num_attention_heads * hd, d, bias=False)
        self.q_norm = RMSNorm(hd, config.rms_norm_eps)
        self.k_norm = RMSNorm(hd, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(d, config.rms_norm_eps)
        self.mlp = SwiGLU(d, config.intermediate_size)

    def qkv(self, emb: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor):
        """``q [..., H, D]``, ``k, v [..., Hkv, D]`` of inputs ``[..., d]`` at ``positions [...]``."""
        x = torch.cat([self.input_layernorm(emb), self.hidden_norm(hidden)], -1)
        hd = self.config.head_dim
        cos, sin = rope_cos_sin(positions, hd, self.config.rope_theta, x.dtype)
        q = apply_rope(self.q_norm(self.q_proj(x).unflatten(-1, (-1, hd))), cos, sin)
        k = apply_rope(self.k_norm(self.k_proj(x).unflatten(-1, (-1, hd))), cos, sin)
        return q, k, self.v_proj(x).unflatten(-1, (-1, hd))

    def finish(self, hidden: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        """Residual on the hidden stream: ``g = h + o(attn)``, then ``g + MLP(norm(g))``."""
        g = hidden + self.o_proj(attended.flatten(-2))
        return g + self.mlp(self.post_attention_layernorm(g))


@dataclass
class ChainCache(ContextCache):
    """Keys and values of the draft layer at committed positions, plus ``last_hidden [B, d]``:
    ``fc(taps)`` of the last committed position, the hidden input of the next anchor."""

    last_hidden: torch.Tensor | None = None

    def select(self, rows: torch.Tensor) -> None:
        super().select(rows)
        self.last_hidden = self.last_hidden[rows.to(self.last_hidden.device)]

    def merge(self, other: ChainCache) -> None:
        super().merge(other)
        self.last_hidden = torch.cat([self.last_hidden, other.last_hidden])


class Eagle3Drafter(nn.Module):
    """The EAGLE-3-style chain drafter. ``config.block_size`` is the chain length γ; one layer, no heads."""

    architecture = "eagle3"
    reduced_vocab = False  # drafts the full vocabulary (method.md §8.1 aligns it with DSpark's)

    def __init__(self, config: DSparkConfig):
        super().__init__()
        if config.num_draft_layers != 1:
            raise ValueError(f"the EAGLE-3 baseline has one draft layer, not {config.num_draft_layers}")
        if config.has_markov or config.enable_confidence_head or config.draft_vocab_size != config.vocab_size:
            raise ValueError("the EAGLE-3 baseline has no Markov or confidence head and drafts the full vocabulary: "
                             "set markov_rank=0, enable_confidence_head=False and no draft_vocab_size")
        self.config = config
        d = config.hidden_size
        self.embed_tokens = nn.Embedding(config.vocab_size, d)
        self.fc = Linear(config.num_taps * config.target_hidden_size, d, bias=False)
        self.layer = Eagle3Layer(config)
        self.norm = RMSNorm(d, config.rms_norm_eps)
        self.lm_head = Linear(d, config.vocab_size, bias=False)
        self.embed_tokens.weight.requires_grad_(False)
        self.lm_head.weight.requires_grad_(False)

    def load_target_embeddings(self, embed_weight: torch.Tensor, lm_head_weight: torch.Tensor) -> None:
        """Copy the target's input embedding and LM head ``[V, d]`` (frozen, shared)."""
        with torch.no_grad():
            self.embed_tokens.weight.copy_(embed_weight)
            self.lm_head.weight.copy_(lm_head_weight)

    def init_weights(self, std: float = 0.02) -> None:
        """N(0, std²) linear weights and unit norms (the frozen embedding and LM head come from the target)."""
        for name, param in self.named_parameters():
            if name.endswith("norm.weight"):
                nn.init.ones_(param)
            elif param.requires_grad:
                nn.init.normal_(param, std=std)

    # -- training
    def ttt_hidden(self, token_ids: torch.Tensor, taps: torch.Tensor, steps: int) -> list[torch.Tensor]:
        """The layer output ``g [S, d]`` of every unrolled step over one sequence (see the module docstring).

        Args:
            token_ids: ``[S]`` the sequence.
            taps: ``[S, taps·H_t]`` the target's tap features at each position.
            steps: how many steps to unroll (γ).
        """
        check_tensor("token_ids", token_ids, ndim=1, integer=True)
        check_tensor("taps", taps, shape=(token_ids.shape[0], None), floating=True)
        positions = torch.arange(token_ids.shape[0], device=token_ids.device)
        emb = self.embed_tokens(token_ids)
        hidden = F.pad(self.fc(taps), (0, 0, 1, 0))[:-1]  # h_{t−1}; zeros before the first position
        keys, values, outputs = [], [], []
        for i in range(steps):
            q, k, v = self.layer.qkv(emb, hidden, positions)
            keys.append(k)
            values.append(v)
            # Step-0 keys up to t − i, then the diagonal keys of steps 1 … i, rolled so row t holds t − i + j.
            rolled_k = [keys[j].roll(i - j, 0) for j in range(1, i + 1)]
            rolled_v = [values[j].roll(i - j, 0) for j in range(1, i + 1)]
            visible0 = positions[None, :] <= positions[:, None] - i
            attended = _unrolled_attention(q, keys[0], values[0], visible0, rolled_k, rolled_v, i)
            outputs.append(self.layer.finish(hidden, attended))
            hidden = F.pad(outputs[-1], (0, 0, 1, 0))[:-1]
        return outputs

    def ttt_logits(self, token_ids: torch.Tensor, taps: torch.Tensor, steps: int) -> list[torch.Tensor]:
        """Logits ``[S, V]`` of every unrolled step: step i's row t is the distribution of ``x_{t+1}``."""
        return [self.lm_head(self.norm(g)) for g in self.ttt_hidden(token_ids, taps, steps)]

    def ttt_loss(self, token_ids: torch.Tensor, taps: torch.Tensor, target_probs: torch.Tensor,
                 loss_mask: torch.Tensor, anchors: torch.Tensor, normalizer: torch.Tensor | float, *,
                 metrics: bool = True) -> TTTOutput:
        """Σ_i 0.8^i · Σ_n soft-CE(step i at row anchor_n + i) / normalizer, over chains from ``anchors``.

        The chain anchored at position a drafts ``x_{a+1} … x_{a+γ}``: step i is read at row a + i. A step
        is supervised while every token it and the earlier steps predict is an assistant token (the
        contiguous prefix of method.md §3), so the supervised rows are exactly a DSpark block's at the same
        anchor. The LM head runs on those rows only.

        Args:
            token_ids: ``[S]``; taps: ``[S, taps·H_t]``; loss_mask: ``[S]`` true on assistant tokens.
            target_probs: ``[S, V]`` the target's distribution of the token after each position.
            anchors: ``[N]`` chain anchors (positions ≥ 1, so that each has a real target feature before it).
            normalizer: the loss denominator (supervised first steps, summed over ranks).
            metrics: also return c* and the greedy hits (three more passes over ``[N, steps, V]``, about 14% of
                a CPU training step, so training leaves them to evaluation).
        """
        steps, seq = self.config.block_size, token_ids.shape[0]
        check_tensor("target_probs", target_probs, shape=(seq, self.config.vocab_size), floating=True)
        check_tensor("loss_mask", loss_mask, shape=(seq,))
        check_tensor("anchors", anchors, ndim=1, integer=True)
        if anchors.numel() and (int(anchors.min()) < 1 or int(anchors.max()) >= seq):
            raise ValueError(f"anchors must lie in [1, {seq}), got {anchors.tolist()}")
        rows = anchors[:, None] + torch.arange(steps, device=anchors.device)  # [N, steps]
        inside = rows < seq - 1
        rows = rows.clamp(max=seq - 1)
        next_is_answer = F.pad(loss_mask[1:].bool(), (0, 1))
        mask = (next_is_answer[rows] & inside).long().cumprod(-1).bool()
        next_ids = F.pad(token_ids[1:], (0, 1))[rows]
        # One head product over every step's rows, not one per step: a larger GEMM, and under autocast the
        # frozen head (autocast caches casts of trainable leaves only) is cast once per sequence, not per step.
        outputs = self.ttt_hidden(token_ids, taps, steps)
        g = torch.stack([out[rows[:, i]] for i, out in enumerate(outputs)], 1)  # [N, steps, d]
        logits = self.lm_head(self.norm(g))
        log_probs = torch.log_softmax(logits.float(), -1)
        probs = target_probs[rows]
        ce = -(probs * log_probs).sum(-1) * mask  # [N, steps]
        ce_sums = ce.sum(0)
        decay = STEP_DECAY ** torch.arange(steps, device=ce_sums.device, dtype=ce_sums.dtype)
        norm = torch.as_tensor(normalizer, dtype=torch.float32, device=ce_sums.device).clamp(min=1)
        out = TTTOutput((decay * ce_sums).sum() / norm, ce_sums.detach(), mask)
        if metrics:
            with torch.no_grad():
                out.acceptance = (1 - 0.5 * (log_probs.exp() - probs).abs().sum(-1)).clamp(0, 1)
                out.hits = logits.argmax(-1) == next_ids
        return out

    # -- decoding
    def new_cache(self, batch_size: int, capacity: int = 64, *, device=None, dtype=None) -> ChainCache:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        param = self.fc.weight
        kwargs = dict(device=device or param.device, dtype=dtype or param.dtype)
        shape = (batch_size, capacity, self.config.num_key_value_heads, self.config.head_dim)
        return ChainCache(keys=[torch.zeros(shape, **kwargs)], values=[torch.zeros(shape, **kwargs)],
                          lengths=torch.zeros(batch_size, dtype=torch.long, device=kwargs["device"]),
                          last_hidden=torch.zeros(batch_size, self.config.hidden_size, **kwargs))

    @torch.no_grad()
    def extend_cache(self, cache: ChainCache, tap_features: torch.Tensor, num_new: torch.Tensor,
                     token_ids: torch.Tensor | None = None) -> None:
        """Append committed positions: their tokens ``token_ids [B, n_max]`` and target taps ``[B, n_max, ·]``."""
        if token_ids is None:
            raise ValueError("the EAGLE-3 drafter's cache needs the committed tokens as well as their features")
        check_tensor("tap_features", tap_features, shape=(cache.batch_size, None, None), floating=True)
        n_max = tap_features.shape[1]
        check_tensor("token_ids", token_ids, shape=(cache.batch_size, n_max), integer=True)
        check_tensor("num_new", num_new, shape=(cache.batch_size,), integer=True)
        num_new = num_new.to(cache.lengths.device)  # the decode loop passes counts it holds on the host
        if bool((num_new < 0).any()) or bool((num_new > n_max).any()):
            raise ValueError(f"num_new must lie in [0, {n_max}], got {num_new.tolist()}")
        cache._reserve(int((cache.lengths + num_new).max()))
        fused = self.fc(tap_features)
        previous = torch.cat([cache.last_hidden[:, None].to(fused.dtype), fused[:, :-1]], 1)
        offsets = torch.arange(n_max, device=num_new.device)
        positions = cache.lengths[:, None] + offsets
        _, keys, values = self.layer.qkv(self.embed_tokens(token_ids), previous, positions)
        rows, cols = (offsets < num_new[:, None]).nonzero(as_tuple=True)
        cache.keys[0][rows, positions[rows, cols]] = keys[rows, cols].to(cache.keys[0].dtype)
        cache.values[0][rows, positions[rows, cols]] = values[rows, cols].to(cache.values[0].dtype)
        has_new = num_new > 0
        last = fused[torch.arange(cache.batch_size, device=fused.device), (num_new - 1).clamp(min=0)]
        cache.last_hidden = torch.where(has_new[:, None], last.to(cache.last_hidden.dtype), cache.last_hidden)
        cache.lengths = cache.lengths + num_new

    def chain_logits(self, anchor_ids: torch.Tensor, cache: ChainCache,
                     choose: Callable[[int, torch.Tensor], torch.Tensor]) -> list[torch.Tensor]:
        """Run the chain over ``cache`` from ``anchor_ids [R]``: ``choose(j, logits [R, V])`` gives step j's token.

        Returns the γ logits ``[R, V]``; :meth:`draft` chooses by sampling, a test by teacher forcing.
        """
        length = int(cache.lengths.max())
        ctx_keys, ctx_values = cache.keys[0][:, :length], cache.values[0][:, :length]
        ctx_visible = torch.arange(length, device=cache.lengths.device)[None] < cache.lengths[:, None]
        token, hidden = anchor_ids, cache.last_hidden.to(self.fc.weight.dtype)
        chain_k, chain_v, out = [], [], []
        for j in range(self.config.block_size):
            q, k, v = self.layer.qkv(self.embed_tokens(token), hidden, cache.lengths + j)
            chain_k.append(k)
            chain_v.append(v)
            keys = torch.cat([ctx_keys.to(k.dtype), torch.stack(chain_k, 1)], 1)
            values = torch.cat([ctx_values.to(v.dtype), torch.stack(chain_v, 1)], 1)
            visible = torch.cat([ctx_visible, ctx_visible.new_ones(len(token), j + 1)], 1)
            hidden = self.layer.finish(hidden, _attend(q, keys, values, visible))
            out.append(self.lm_head(self.norm(hidden)))
            token = choose(j, out[-1])
        return out

    @torch.no_grad()
    def draft(self, anchor_ids: torch.Tensor, cache: ChainCache, uniforms: torch.Tensor, *,
              temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
              backend: str = "auto") -> DraftOutput:
        """Sample a chain of γ tokens per request, each from the warped distribution at its step.

        Args:
            anchor_ids: ``[R]`` the last committed token of each request.
            uniforms: ``[R, γ]`` draws in ``[0, 1)``, one per step (inverse-CDF sampling).
            backend: accepted for the decoder's sake; the chain runs in PyTorch.
        """
        check_tensor("uniforms", uniforms, shape=(anchor_ids.shape[0], self.config.block_size), floating=True)
        tokens, probs = [], []

        def sample(j: int, logits: torch.Tensor) -> torch.Tensor:
            probs.append(warp_logits(logits, temperature, top_k, top_p))
            tokens.append(sample_from_probs(probs[-1], uniforms[:, j].to(probs[-1].dtype)))
            return tokens[-1]

        self.chain_logits(anchor_ids, cache, sample)
        return DraftOutput(torch.stack(tokens, 1), torch.stack(probs, 1))


def _attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    """Grouped-query attention: ``q [R, H, D]`` over ``keys, values [R, S, Hkv, D]`` where ``visible [R, S]``."""
    group = q.shape[-2] // keys.shape[-2]
    keys = keys.repeat_interleave(group, dim=-2)
    values = values.repeat_interleave(group, dim=-2)
    scores = torch.einsum("rhd,rshd->rhs", q, keys) * q.shape[-1] ** -0.5
    scores = scores.masked_fill(~visible[:, None, :], float("-inf"))
    weights = torch.softmax(scores.to(torch.promote_types(scores.dtype, torch.float32)), -1)
    return torch.einsum("rhs,rshd->rhd", weights.to(values.dtype), values)


def _unrolled_attention(q, k0, v0, visible0, rolled_k, rolled_v, step):
    """Step ``step``'s attention for queries ``q [S, H, D]``: the step-0 keys ``k0 [S, Hkv, D]`` where
    ``visible0 [S, S]``, plus one diagonal key per earlier step j (row t holds position t − step + j,
    visible where that position is ≥ 0)."""
    seq = q.shape[0]
    group = q.shape[1] // k0.shape[1]
    scale = q.shape[-1] ** -0.5
    scores = [torch.einsum("thd,shd->ths", q, k0.repeat_interleave(group, dim=1)) * scale]
    scores[0] = scores[0].masked_fill(~visible0[:, None, :], float("-inf"))
    positions = torch.arange(seq, device=q.device)
    for j, kj in enumerate(rolled_k, start=1):
        s = (q * kj.repeat_interleave(group, dim=1)).sum(-1, keepdim=True) * scale  # [S, H, 1]
        scores.append(s.masked_fill(~(positions - step + j >= 0)[:, None, None], float("-inf")))
    scores = torch.cat(scores, -1)
    weights = torch.softmax(scores.to(torch.promote_types(scores.dtype, torch.float32)), -1).to(q.dtype)
    out = torch.einsum("ths,shd->thd", weights[..., :seq], v0.repeat_interleave(group, dim=1))
    for j, vj in enumerate(rolled_v, start=1):
        out = out + weights[..., seq + j - 1 : seq + j] * vj.repeat_interleave(group, dim=1)
    return out
