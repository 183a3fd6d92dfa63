"""DSparkConfig: every size and switch of a DSpark drafter, validated, and round-tripping through JSON."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

MARKOV_HEAD_TYPES = ("vanilla", "gated", "rnn")


def uniform_tap_layers(num_target_layers: int, num_taps: int) -> list[int]:
    """Tap ids spread uniformly over target layers ``[1, L-3]`` (DFlash's ``build_target_layer_ids``).

    For a 36-layer target and 5 taps this gives ``[1, 9, 17, 25, 33]``, DeepSpec's Qwen3 choice. The last
    layer is never tapped: its output is what the final norm reads, not a feature the draft should see.
    """
    if num_taps < 1:
        raise ValueError(f"num_taps must be >= 1, got {num_taps}")
    if num_target_layers < 4:
        raise ValueError(f"need a target with at least 4 layers to spread taps over [1, L-3], got {num_target_layers}")
    if num_taps == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    span = end - start
    return [start + round(i * span / (num_taps - 1)) for i in range(num_taps)]


@dataclass
class DSparkConfig:
    """Configuration of a DSpark drafter.

    Sizes of the draft decoder layers are inherited from the target (method.md §2.2); use
    :meth:`from_target_config` to copy them from a Hugging Face config.

    Attributes:
        vocab_size: target vocabulary size V (rows of the frozen embedding and of Markov ``W1``).
        hidden_size: d, shared by target and draft.
        num_attention_heads, num_key_value_heads, head_dim: attention geometry (GQA when kv < q heads).
        intermediate_size: SwiGLU MLP width.
        num_target_layers: layers in the target, used to check the taps.
        target_layer_ids: decoder layers whose raw outputs are tapped (0-based; -1 is the embedding output).
        mask_token_id: a reserved target-vocabulary row that fills the γ−1 mask slots.
        block_size: γ, the number of draft slots (anchor + γ−1 masks → γ drafts with ``sample_from_anchor``).
        num_draft_layers: decoder layers in the drafter.
        draft_vocab_size: V_draft of ``lm_head``/``W2``; ``None`` means the full target vocabulary.
        markov_rank: r; 0 disables the sequential head (the DFlash baseline).
        markov_head_type: ``vanilla`` | ``gated`` | ``rnn`` (method.md §4.1).
        enable_confidence_head: whether the drafter scores its tokens (method.md §5.1).
        confidence_head_with_markov: concatenate ``W1[x_{k-1}]`` to ``h_k`` in the confidence head.
        confidence_head_bias: DeepSpec's head has a bias, DeepSeek-V4's has none (method.md §10).
        qk_norm: per-head RMSNorm on queries and keys (Qwen3 has it, Llama does not).
        rope_theta, rms_norm_eps, max_position_embeddings: inherited from the target.
        sample_from_anchor: DSpark's layout, slot k predicts position anchor+k+1 (method.md §2.1). Only ``True``
            is implemented; the field exists so that checkpoints say which layout they use.
        target_hidden_size: width of each tapped feature; ``None`` means ``hidden_size``.
    """

    vocab_size: int
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    num_target_layers: int
    target_layer_ids: list[int]
    mask_token_id: int
    head_dim: int | None = None
    block_size: int = 7
    num_draft_layers: int = 5
    draft_vocab_size: int | None = None
    markov_rank: int = 256
    markov_head_type: str = "vanilla"
    enable_confidence_head: bool = True
    confidence_head_with_markov: bool = True
    confidence_head_bias: bool = True
    qk_norm: bool = True
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 4096
    sample_from_anchor: bool = True
    target_hidden_size: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.target_layer_ids = [int(i) for i in self.target_layer_ids]
        if self.head_dim is None:
            self.head_dim = self.hidden_size // max(self.num_attention_heads, 1)
        if self.draft_vocab_size is None:
            self.draft_vocab_size = self.vocab_size
        if self.target_hidden_size is None:
            self.target_hidden_size = self.hidden_size
        self.validate()

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first inconsistent field."""
        positive = (
            "vocab_size", "hidden_size", "num_attention_heads", "num_key_value_heads", "intermediate_size",
            "num_target_layers", "head_dim", "block_size", "num_draft_layers", "draft_vocab_size",
            "target_hidden_size", "max_position_embeddings",
        )
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"DSparkConfig.{name} must be a positive int, got {value!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads}) for grouped-query attention"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for rotary embeddings, got {self.head_dim}")
        if self.draft_vocab_size > self.vocab_size:
            raise ValueError(
                f"draft_vocab_size ({self.draft_vocab_size}) cannot exceed vocab_size ({self.vocab_size})"
            )
        if not 0 <= self.mask_token_id < self.vocab_size:
            raise ValueError(f"mask_token_id must lie in [0, {self.vocab_size}), got {self.mask_token_id}")
        if not self.target_layer_ids:
            raise ValueError("target_layer_ids must name at least one tapped layer")
        if len(set(self.target_layer_ids)) != len(self.target_layer_ids):
            raise ValueError(f"target_layer_ids must be distinct, got {self.target_layer_ids}")
        last = self.num_target_layers - 1
        for tap in self.target_layer_ids:
            if not -1 <= tap < last:
                raise ValueError(
                    f"tap {tap} out of range: taps must lie in [-1, {last - 1}] for a {self.num_target_layers}-layer "
                    f"target (-1 is the embedding output; the last layer {last} feeds the final norm and is "
                    "never tapped)"
                )
        if self.markov_head_type not in MARKOV_HEAD_TYPES:
            raise ValueError(f"markov_head_type must be one of {MARKOV_HEAD_TYPES}, got {self.markov_head_type!r}")
        if not isinstance(self.markov_rank, int) or self.markov_rank < 0:
            raise ValueError(f"markov_rank must be an int >= 0 (0 disables the head), got {self.markov_rank!r}")
        if self.markov_rank == 0 and self.markov_head_type != "vanilla":
            raise ValueError(
                f"markov_rank=0 disables the sequential head, but markov_head_type={self.markov_head_type!r} "
                "asks for one: give a positive rank or use 'vanilla'"
            )
        if self.enable_confidence_head and self.confidence_head_with_markov and self.markov_rank == 0:
            raise ValueError(
                "confidence_head_with_markov needs the Markov embedding W1, but markov_rank=0; "
                "set confidence_head_with_markov=False"
            )
        if not self.sample_from_anchor:
            raise ValueError(
                "sample_from_anchor=False (the z-lab DFlash layout) is not implemented; dspark drafts "
                "next-token style from the anchor (method.md §2.1)"
            )
        if self.rope_theta <= 0 or self.rms_norm_eps <= 0:
            raise ValueError(
                f"rope_theta and rms_norm_eps must be positive, got {self.rope_theta}, {self.rms_norm_eps}"
            )

    @property
    def num_taps(self) -> int:
        return len(self.target_layer_ids)

    @property
    def has_markov(self) -> bool:
        return self.markov_rank > 0

    @classmethod
    def from_target_config(
        cls,
        target_config: Any,
        *,
        target_layer_ids: Sequence[int] | None = None,
        num_taps: int = 5,
        mask_token_id: int | None = None,
        **overrides: Any,
    ) -> DSparkConfig:
        """Build a config whose layer sizes copy a Hugging Face causal-LM config (duck-typed).

        Taps default to :func:`uniform_tap_layers`; the mask token defaults to the target's pad token,
        else its last vocabulary row. ``qk_norm`` is on for Qwen3-style targets.
        """
        get = lambda name, default=None: getattr(target_config, name, default)  # noqa: E731
        num_layers = get("num_hidden_layers")
        if num_layers is None or get("hidden_size") is None or get("vocab_size") is None:
            raise ValueError("target_config must have num_hidden_layers, hidden_size and vocab_size")
        taps = list(target_layer_ids) if target_layer_ids is not None else uniform_tap_layers(num_layers, num_taps)
        if mask_token_id is None:
            pad = get("pad_token_id")
            mask_token_id = pad if isinstance(pad, int) and pad >= 0 else get("vocab_size") - 1
        heads = get("num_attention_heads")
        kwargs: dict[str, Any] = dict(
            vocab_size=get("vocab_size"),
            hidden_size=get("hidden_size"),
            num_attention_heads=heads,
            num_key_value_heads=get("num_key_value_heads") or heads,
            head_dim=get("head_dim") or get("hidden_size") // heads,
            intermediate_size=get("intermediate_size"),
            num_target_layers=num_layers,
            target_layer_ids=taps,
            mask_token_id=mask_token_id,
            rope_theta=float(get("rope_theta") or (get("rope_parameters") or {}).get("rope_theta", 10000.0)),
            rms_norm_eps=float(get("rms_norm_eps", 1e-6)),
            max_position_embeddings=int(get("max_position_embeddings", 4096)),
            qk_norm=str(get("model_type", "")).startswith("qwen3"),
        )
        kwargs.update(overrides)
        return cls(**kwargs)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DSparkConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown DSparkConfig fields {unknown}; known fields are {sorted(known)}")
        return cls(**data)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> DSparkConfig:
        return cls.from_dict(json.loads(text))

    def save(self, path: str | os.PathLike) -> None:
        """Write the config as JSON atomically (a reader never sees half a file)."""
        from dspark.io import atomic_write_text

        atomic_write_text(path, self.to_json() + "\n")

    @classmethod
    def load(cls, path: str | os.PathLike) -> DSparkConfig:
        with open(path, encoding="utf-8") as f:
            return cls.from_json(f.read())
