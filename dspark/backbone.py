"""The parallel block backbone (method.md §2): one non-causal pass drafts γ slots from the target's features.

Input block ``[x_0 (anchor), m, …, m]`` at positions ``pos(x_0) … pos(x_0)+γ−1``. The tapped target
features of the committed tokens before the anchor are fused once,
``H_ctx = RMSNorm(W_c · concat(taps))``, and every draft layer injects them as extra keys and values with
its own ``W_k``, ``W_v`` (KV injection). Slot k's final hidden state ``h_k`` gives the base logits
``U_k = lm_head(h_k)`` for the token at position ``pos(x_0)+k+1``.

Parameter names follow the speculators checkpoint layout (method.md §10) so export is a rename-free copy.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, replace

import torch
import torch.nn.functional as F
from torch import nn

from dspark._checks import check_range, check_tensor, check_token_range, values_checked
from dspark.attention import block_attention
from dspark.backend import upload
from dspark.config import DSparkConfig
from dspark.linear import Linear


class RMSNorm(nn.Module):
    """``x / rms(x) · weight``, computed in fp32 (or wider) and cast back."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        compute = torch.promote_types(x.dtype, torch.float32)
        y = x.to(compute)
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight.to(compute) * y).to(x.dtype)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype):
    """``cos, sin`` of shape ``[*positions.shape, head_dim]`` (half-split "rotate_half" convention)."""
    exponent = torch.arange(0, head_dim, 2, dtype=torch.float64, device=positions.device) / head_dim
    inv_freq = theta ** (-exponent)
    angles = positions.to(torch.float64)[..., None] * inv_freq
    angles = torch.cat([angles, angles], -1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x [..., H, D]`` by per-position ``cos, sin [..., D]`` (broadcast over heads)."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos.unsqueeze(-2) + rotated * sin.unsqueeze(-2)


class DraftAttention(nn.Module):
    """Grouped-query attention whose keys and values are ``[W_k H_ctx ; W_k x_block]`` (method.md §2.2)."""

    def __init__(self, config: DSparkConfig):
        super().__init__()
        self.config = config
        d, hd = config.hidden_size, config.head_dim
        self.q_proj = Linear(d, config.num_attention_heads * hd, bias=False)
        self.k_proj = Linear(d, config.num_key_value_heads * hd, bias=False)
        self.v_proj = Linear(d, config.num_key_value_heads * hd, bias=False)
        self.o_proj = Linear(config.num_attention_heads * hd, d, bias=False)
        if config.qk_norm:
            self.q_norm = RMSNorm(hd, config.rms_norm_eps)
            self.k_norm = RMSNorm(hd, config.rms_norm_eps)

    def _heads(self, x: torch.Tensor, proj: nn.Linear, norm_name: str) -> torch.Tensor:
        x = proj(x).unflatten(-1, (-1, self.config.head_dim))
        norm = getattr(self, norm_name, None)
        return norm(x) if norm is not None else x

    def context_kv(self, ctx_hidden: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values ``[B, S, Hkv, D]`` of fused context rows ``[B, S, d]`` at ``positions [B, S]``."""
        cos, sin = rope_cos_sin(positions, self.config.head_dim, self.config.rope_theta, ctx_hidden.dtype)
        keys = apply_rope(self._heads(ctx_hidden, self.k_proj, "k_norm"), cos, sin)
        return keys, self.v_proj(ctx_hidden).unflatten(-1, (-1, self.config.head_dim))

    def forward(self, x, block_pos, k_ctx, v_ctx, ctx_len, block_valid, backend="auto"):
        """``x [B, N, γ, d]`` at ``block_pos [B, N, γ]`` over context K/V ``[B, S, Hkv, D]``."""
        cos, sin = rope_cos_sin(block_pos, self.config.head_dim, self.config.rope_theta, x.dtype)
        q = apply_rope(self._heads(x, self.q_proj, "q_norm"), cos, sin)
        k = apply_rope(self._heads(x, self.k_proj, "k_norm"), cos, sin)
        v = self.v_proj(x).unflatten(-1, (-1, self.config.head_dim))
        out = block_attention(q, k_ctx, v_ctx, k, v, ctx_len, block_valid, backend=backend)
        return self.o_proj(out.flatten(-2))


class SwiGLU(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.gate_proj = Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DraftLayer(nn.Module):
    """Pre-norm decoder layer: ``x += Attn(norm(x), H_ctx); x += MLP(norm(x))``.

    ``dropout`` zeroes that fraction of each branch's outputs in training mode (and rescales the rest); it is
    a training-time regulariser, so it is not part of the config and inference never applies it.
    """

    def __init__(self, config: DSparkConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = DraftAttention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = SwiGLU(config.hidden_size, config.intermediate_size)

    def forward(self, x, block_pos, k_ctx, v_ctx, ctx_len, block_valid, backend="auto", dropout: float = 0.0):
        attended = self.self_attn(self.input_layernorm(x), block_pos, k_ctx, v_ctx, ctx_len, block_valid, backend)
        x = x + F.dropout(attended, dropout, self.training)
        return x + F.dropout(self.mlp(self.post_attention_layernorm(x)), dropout, self.training)


@dataclass
class ContextCache:
    """Per-layer keys and values of the fused context rows of each request (method.md §2.4).

    ``keys[l]``, ``values[l]``: ``[B, capacity, Hkv, D]``; ``lengths [B]``: rows filled per request, which is
    also the position of the next anchor. Only context rows are ever stored: block keys and values are
    recomputed every round, so "crop back to the anchor" is simply never writing them. ``host_lengths``, when
    kept, is a copy of ``lengths`` in host memory: the host sizes its work from it instead of waiting for the
    device (a caller that extends the cache with counts it holds on the host keeps it without any read).
    """

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    lengths: torch.Tensor
    host_lengths: torch.Tensor | None = None

    @property
    def batch_size(self) -> int:
        return self.lengths.shape[0]

    @property
    def capacity(self) -> int:
        return self.keys[0].shape[1]

    def crop(self, lengths: torch.Tensor) -> None:
        """Forget rows at and after ``lengths[b]`` (rows past a length are never read, so this is O(1))."""
        check_tensor("lengths", lengths, shape=(self.batch_size,), integer=True)
        if bool((lengths < 0).any()) or bool((lengths > self.lengths).any()):
            raise ValueError(f"crop lengths must lie in [0, current lengths {self.lengths.tolist()}], "
                             f"got {lengths.tolist()}")
        self.lengths = lengths.to(self.lengths)
        if self.host_lengths is not None:
            self.host_lengths = lengths.cpu()

    def select(self, rows: torch.Tensor) -> None:
        """Keep only the requests ``rows`` (e.g. drop finished ones)."""
        rows = rows.to(self.lengths.device)
        self.keys = [k[rows] for k in self.keys]
        self.values = [v[rows] for v in self.values]
        self.lengths = self.lengths[rows]
        if self.host_lengths is not None:
            self.host_lengths = self.host_lengths[rows.cpu()]

    def merge(self, other: ContextCache) -> None:
        """Append the requests of ``other``, in place (continuous batching); the capacity becomes the larger."""
        capacity = max(self.capacity, other.capacity)

        def padded(t: torch.Tensor) -> torch.Tensor:
            return torch.cat([t, t.new_zeros(t.shape[0], capacity - t.shape[1], *t.shape[2:])], 1)

        self.keys = [torch.cat([padded(a), padded(b)]) for a, b in zip(self.keys, other.keys)]
        self.values = [torch.cat([padded(a), padded(b)]) for a, b in zip(self.values, other.values)]
        self.lengths = torch.cat([self.lengths, other.lengths.to(self.lengths)])
        mirrored = self.host_lengths is not None and other.host_lengths is not None
        self.host_lengths = torch.cat([self.host_lengths, other.host_lengths]) if mirrored else None

    def longest(self) -> int:
        """The most rows any request holds: from the host copy when kept, else read from the device."""
        return int((self.lengths if self.host_lengths is None else self.host_lengths).max())

    def _reserve(self, needed: int) -> None:
        if needed <= self.capacity:
            return
        new_capacity = max(needed, 2 * self.capacity, 16)
        for store in (self.keys, self.values):
            for i, t in enumerate(store):
                grown = t.new_zeros(t.shape[0], new_capacity, *t.shape[2:])
                grown[:, : t.shape[1]] = t
                store[i] = grown


@dataclass
class StaticContextCache(ContextCache):
    """A context cache whose memory never moves: what a captured CUDA graph needs, as it reads the addresses it
    saw at capture.

    ``key_storage[l]``, ``value_storage[l]``: ``[max_batch, capacity, Hkv, D]``, allocated once; the ``B``
    running requests hold rows ``0 … B−1`` and ``keys[l]``, ``values[l]`` are views of those rows. Dropping
    requests moves the kept rows to the front, and joining ones are copied in after them; a request needing more
    than ``capacity`` positions, or a batch of more than ``max_batch``, is a ``ValueError`` (size it for the
    longest prompt plus the tokens to generate). Rows past a request's length hold stale but finite values, so
    attention may read the whole capacity and mask them.
    """

    key_storage: list[torch.Tensor] = field(default_factory=list)
    value_storage: list[torch.Tensor] = field(default_factory=list)

    @property
    def max_batch(self) -> int:
        return self.key_storage[0].shape[0]

    def _view(self, batch: int) -> None:
        self.keys = [store[:batch] for store in self.key_storage]
        self.values = [store[:batch] for store in self.value_storage]

    def select(self, rows: torch.Tensor) -> None:
        """Keep only the requests ``rows``, moved to the front of the storage in that order."""
        rows = rows.to(self.lengths.device)
        for store in (*self.key_storage, *self.value_storage):
            store[: len(rows)] = store[rows]  # the gather copies first, so overlapping rows move safely
        self._view(len(rows))
        self.lengths = self.lengths[rows]
        if self.host_lengths is not None:
            self.host_lengths = self.host_lengths[rows.cpu()]

    def merge(self, other: ContextCache) -> None:
        """Copy the requests of ``other`` in after the running ones."""
        start, joining = self.batch_size, other.batch_size
        if start + joining > self.max_batch:
            raise ValueError(f"the static context cache holds {self.max_batch} requests; "
                             f"{start} + {joining} would run")
        needed = other.longest()
        if needed > self.capacity:
            raise ValueError(f"the static context cache holds {self.capacity} positions a request; "
                             f"a joining request holds {needed}")
        width = min(other.capacity, self.capacity)
        for stores, parts in ((self.key_storage, other.keys), (self.value_storage, other.values)):
            for store, part in zip(stores, parts):
                store[start: start + joining, :width] = part[:, :width]
        self._view(start + joining)
        self.lengths = torch.cat([self.lengths, other.lengths.to(self.lengths)])
        mirrored = self.host_lengths is not None and other.host_lengths is not None
        self.host_lengths = torch.cat([self.host_lengths, other.host_lengths]) if mirrored else None

    def _reserve(self, needed: int) -> None:
        if needed > self.capacity:
            raise ValueError(f"the static context cache holds {self.capacity} positions a request; {needed} are "
                             "needed (size it for the longest prompt plus the tokens to generate)")


class BlockBackbone(nn.Module):
    """DFlash-style parallel drafter with speculators' parameter names.

    ``embed_tokens`` and ``lm_head`` are frozen copies of the target's (load them with
    :meth:`load_target_embeddings`); ``fc``, ``hidden_norm``, ``layers`` and ``norm`` are trained.
    """

    def __init__(self, config: DSparkConfig):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.fc = Linear(config.num_taps * config.target_hidden_size, config.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.layers = nn.ModuleList(DraftLayer(config) for _ in range(config.num_draft_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = Linear(config.hidden_size, config.draft_vocab_size, bias=False)
        self.embed_tokens.weight.requires_grad_(False)
        self.lm_head.weight.requires_grad_(False)

    @torch.no_grad()
    def load_target_embeddings(self, embed_weight: torch.Tensor, lm_head_weight: torch.Tensor) -> None:
        """Copy the target's input embedding ``[V, d]`` and LM head ``[V_draft, d]`` (rows already selected)."""
        check_tensor("embed_weight", embed_weight, shape=tuple(self.embed_tokens.weight.shape), floating=True)
        check_tensor("lm_head_weight", lm_head_weight, shape=tuple(self.lm_head.weight.shape), floating=True)
        self.embed_tokens.weight.copy_(embed_weight)
        self.lm_head.weight.copy_(lm_head_weight)

    @torch.no_grad()
    def grow(self, num_draft_layers: int) -> None:
        """Stack layers on top until there are ``num_draft_layers``, without changing what the drafter computes.

        Each new layer is a copy of the current top layer with its attention and MLP output projections
        (``o_proj``, ``down_proj``) zeroed, so both residual branches add nothing until training moves those
        weights; its query, key, value and MLP input weights start as trained features rather than noise.
        """
        current = len(self.layers)
        if num_draft_layers < current:
            raise ValueError(f"a drafter of {current} layers cannot grow to {num_draft_layers}")
        for _ in range(num_draft_layers - current):
            layer = copy.deepcopy(self.layers[-1])
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
            self.layers.append(layer)
        # A new config: the old one may be shared with other drafters, which keep their layers.
        self.config = replace(self.config, num_draft_layers=num_draft_layers)

    def block_ids(self, anchor_ids: torch.Tensor) -> torch.Tensor:
        """``[..., γ]`` input ids ``[anchor, mask, …, mask]`` for anchors ``[...]``."""
        mask = torch.full((*anchor_ids.shape, self.config.block_size - 1), self.config.mask_token_id,
                          dtype=anchor_ids.dtype, device=anchor_ids.device)
        return torch.cat([anchor_ids[..., None], mask], -1)

    def fuse_context(self, tap_features: torch.Tensor) -> torch.Tensor:
        """``H_ctx = RMSNorm(fc(concat(taps)))``: ``[..., taps·H_t] → [..., d]`` (method.md §2.2)."""
        expected = self.config.num_taps * self.config.target_hidden_size
        check_tensor("tap_features", tap_features, floating=True, finite=True)
        if tap_features.shape[-1] != expected:
            raise ValueError(
                f"tap_features must end in {self.config.num_taps} taps x {self.config.target_hidden_size} = {expected} "
                f"features, got {tap_features.shape[-1]}"
            )
        return self.hidden_norm(self.fc(tap_features))

    def forward(
        self,
        anchor_ids: torch.Tensor,
        anchor_pos: torch.Tensor,
        tap_features: torch.Tensor,
        block_valid: torch.Tensor | None = None,
        *,
        backend: str = "auto",
        dropout: float = 0.0,
    ) -> torch.Tensor:
        """Training layout: N blocks per sequence over a shared context (method.md §2.3).

        Args:
            anchor_ids: ``[B, N]`` anchor tokens.
            anchor_pos: ``[B, N]`` their positions; block n sees context rows ``< anchor_pos[b, n]``.
            tap_features: ``[B, S, taps·H_t]`` target features of every position, at positions ``0..S−1``.
            block_valid: ``[B, N]`` bool, ``False`` for padding blocks: they attend to nothing, and their
                outputs carry no information (the loss masks them out).
            dropout: in training mode, the fraction of the fused context features and of each layer's
                attention and MLP outputs zeroed (a regulariser against memorising the training sequences);
                ignored in eval mode.

        Returns:
            ``h [B, N, γ, d]``: the final-normed hidden states (``lm_head(h)`` are the base logits).
        """
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must lie in [0, 1), got {dropout}")
        check_tensor("anchor_ids", anchor_ids, ndim=2, integer=True)
        batch, num_blocks = anchor_ids.shape
        check_tensor("anchor_pos", anchor_pos, shape=(batch, num_blocks), integer=True)
        check_tensor("tap_features", tap_features, shape=(batch, None, None), floating=True)
        check_token_range("anchor_ids", anchor_ids, self.config.vocab_size)
        seq_len = tap_features.shape[1]
        check_range("anchor_pos", anchor_pos, 0, seq_len, " (the context length)")
        ctx_hidden = F.dropout(self.fuse_context(tap_features), dropout, self.training)
        ctx_pos = torch.arange(seq_len, device=tap_features.device).expand(batch, seq_len)
        block_pos = anchor_pos[..., None] + torch.arange(self.config.block_size, device=anchor_pos.device)
        x = self.embed_tokens(self.block_ids(anchor_ids)).to(ctx_hidden.dtype)
        for layer in self.layers:
            k_ctx, v_ctx = layer.self_attn.context_kv(ctx_hidden, ctx_pos)
            x = layer(x, block_pos, k_ctx, v_ctx, anchor_pos, block_valid, backend, dropout)
        return self.norm(x)

    def new_cache(self, batch_size: int, capacity: int = 64, *, device=None, dtype=None) -> ContextCache:
        """An empty context cache for ``batch_size`` requests."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        param = self.fc.weight
        shape = (batch_size, capacity, self.config.num_key_value_heads, self.config.head_dim)
        kwargs = dict(device=device or param.device, dtype=dtype or param.dtype)
        return ContextCache(
            keys=[torch.zeros(shape, **kwargs) for _ in self.layers],
            values=[torch.zeros(shape, **kwargs) for _ in self.layers],
            lengths=torch.zeros(batch_size, dtype=torch.long, device=kwargs["device"]),
            host_lengths=torch.zeros(batch_size, dtype=torch.long),
        )

    def new_static_cache(self, max_batch: int, capacity: int, *, device=None, dtype=None) -> StaticContextCache:
        """An empty :class:`StaticContextCache` of ``max_batch`` requests × ``capacity`` positions, no request in
        it yet (requests join by :meth:`ContextCache.merge`)."""
        if max_batch < 1 or capacity < 1:
            raise ValueError(f"max_batch and capacity must be >= 1, got {max_batch} and {capacity}")
        param = self.fc.weight
        shape = (max_batch, capacity, self.config.num_key_value_heads, self.config.head_dim)
        kwargs = dict(device=device or param.device, dtype=dtype or param.dtype)
        cache = StaticContextCache(
            keys=[], values=[], lengths=torch.zeros(0, dtype=torch.long, device=kwargs["device"]),
            host_lengths=torch.zeros(0, dtype=torch.long),
            key_storage=[torch.zeros(shape, **kwargs) for _ in self.layers],
            value_storage=[torch.zeros(shape, **kwargs) for _ in self.layers],
        )
        cache._view(0)
        return cache

    @torch.no_grad()
    def extend_cache(self, cache: ContextCache, tap_features: torch.Tensor, num_new: torch.Tensor,
                     token_ids: torch.Tensor | None = None) -> None:
        """Append ``num_new[b]`` context rows per request (ragged) at positions ``lengths[b], …``.

        Args:
            tap_features: ``[B, n_max, taps·H_t]``: the target features of the newly committed tokens
                ``[old anchor, accepted drafts]``; rows past ``num_new[b]`` are ignored.
            num_new: ``[B]`` rows to take per request (0 allowed), on the host or the device. Counts the caller
                holds on the host keep the cache's host copy of its lengths without a wait for the device (the
                decode loop passes those it read back); counts on the device are read once here.
            token_ids: the committed tokens at those rows; unused here (DSpark's context is features only),
                accepted so that every drafter takes what the decoder passes.
        """
        check_tensor("tap_features", tap_features, shape=(cache.batch_size, None, None), floating=True)
        check_tensor("num_new", num_new, shape=(cache.batch_size,), integer=True)
        n_max = tap_features.shape[1]
        device = cache.lengths.device
        counts = num_new.cpu()
        if values_checked() and (bool((counts < 0).any()) or bool((counts > n_max).any())):
            raise ValueError(f"num_new must lie in [0, {n_max}], got {counts.tolist()}")
        if cache.host_lengths is None:
            cache.host_lengths = cache.lengths.cpu()
        cache._reserve(int((cache.host_lengths + counts).max()))
        ctx_hidden = self.fuse_context(tap_features)
        positions = cache.lengths[:, None] + torch.arange(n_max, device=device)  # [B, n_max]
        # The ragged rows to write, found on the host, then sent: no wait for the device to count them.
        rows, cols = (torch.arange(n_max) < counts[:, None]).nonzero(as_tuple=True)
        rows, cols = upload(rows, device), upload(cols, device)
        slots = positions[rows, cols]
        for layer, key_store, value_store in zip(self.layers, cache.keys, cache.values):
            keys, values = layer.self_attn.context_kv(ctx_hidden, positions)
            key_store[rows, slots] = keys[rows, cols].to(key_store.dtype)
            value_store[rows, slots] = values[rows, cols].to(value_store.dtype)
        cache.lengths = cache.lengths + upload(counts, device)
        cache.host_lengths = cache.host_lengths + counts

    def forward_cached(self, anchor_ids: torch.Tensor, cache: ContextCache, *, backend: str = "auto",
                       context_rows: int | None = None) -> torch.Tensor:
        """Inference layout: one block per request at positions ``lengths[b] …`` over its cache.

        Args:
            anchor_ids: ``[B]`` the current anchors (the last committed tokens, not yet in the cache).
            context_rows: how many cache rows attention reads per request (rows past a request's length are
                masked). ``None`` reads as many as the longest request holds, a shape that changes every round;
                a captured graph passes the cache's capacity, a shape that never does.

        Returns:
            ``h [B, γ, d]``.
        """
        check_tensor("anchor_ids", anchor_ids, shape=(cache.batch_size,), integer=True)
        check_token_range("anchor_ids", anchor_ids, self.config.vocab_size)
        anchor_pos = cache.lengths[:, None]
        block_pos = anchor_pos[..., None] + torch.arange(self.config.block_size, device=anchor_ids.device)
        x = self.embed_tokens(self.block_ids(anchor_ids[:, None])).to(cache.keys[0].dtype)
        # Rows past the longest context are spare capacity: attention would upcast and mask them every round.
        filled = cache.longest() if context_rows is None else context_rows
        for keys, values, layer in zip(cache.keys, cache.values, self.layers):
            x = layer(x, block_pos, keys[:, :filled], values[:, :filled], anchor_pos, None, backend)
        return self.norm(x)[:, 0]
