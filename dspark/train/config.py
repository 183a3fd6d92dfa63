"""A training run's settings (:class:`TrainConfig`) and its learning-rate schedule."""

from __future__ import annotations

import math
from dataclasses import dataclass

from dspark.loss import CE_WEIGHT, CONFIDENCE_WEIGHT, DECAY, L1_WEIGHT
from dspark.train.distributed import PARALLEL


@dataclass
class TrainConfig:
    """The training recipe (the paper's, scaled down).

    ``objective``: ``dspark`` (0.1·CE + 0.9·L1 + BCE, method.md §8), ``dflash`` (CE), or ``eagle3`` (the
    unrolled soft-CE of :class:`dspark.eagle3.Eagle3Drafter`, method.md §8.1; anchors unused).

    ``ce_weight`` and ``l1_weight`` replace the dspark objective's 0.1 and 0.9 (``None`` keeps them). The
    L1 term matches the drafter's whole distribution to the target's, which is what acceptance under
    sampling rewards; greedy verification rewards only the argmax, which cross-entropy trains directly.
    The confidence head's BCE stays at weight 1 either way: its label, ``1 − L1/2``, needs no L1 gradient.

    ``dropout``: the fraction of the backbone's fused context and of its layers' attention and MLP outputs
    zeroed in training steps (:meth:`dspark.backbone.BlockBackbone.forward`), a regulariser for drafters that
    see the same sequences many times; evaluation never drops. Not for ``eagle3``.

    ``step_offset``: the steps a drafter took before this run, when the run continues it. Its data order and
    anchors pick up after them (no step repeats an earlier one's blocks) and the steps it reports count from
    there; the learning-rate schedule (warm-up, then cosine over ``steps``) starts over.

    ``precision``: ``bf16`` runs the drafter under bf16 autocast and the loss's vocabulary products on bf16
    operands (softmax, CE, L1 and the weights' updates stay fp32); ``fp32`` runs everything in fp32;
    ``auto`` is bf16 on a GPU and fp32 on a CPU. On CPUs with bf16 units ``bf16`` is about twice as fast;
    on CPUs without them it is emulated and far slower (:func:`fastest_precision` measures which).

    ``parallel``: the data-parallel engine under ``torch.distributed`` (:mod:`dspark.train.distributed`): ``ddp``,
    ``fsdp``, ``none`` or ``auto`` (``ddp`` with several ranks). ``sequences_per_step`` is the global batch
    and must divide evenly over the ranks; every engine takes the same steps as one process.

    ``checkpoint_every`` and ``checkpoint_minutes``: :meth:`Trainer.fit` with an ``output_dir`` checkpoints after
    every that many steps or once that many minutes have passed since the last checkpoint, whichever comes
    first (0 turns either off), so a killed run loses at most that much; under ``torch.distributed`` rank 0's
    clock decides for every rank.

    ``compile``: ``True`` runs the step's forward, loss and backward through ``torch.compile`` (the eager step is
    the reference it is tested against); ``"reduce-overhead"`` also has inductor capture them into CUDA graphs,
    one replay a step instead of a launch a kernel, for each shape it meets (on a CPU it is ``True``). Contexts
    are then padded to a multiple of :data:`COMPILED_LENGTH_BUCKET` rows, so that a few shapes repeat instead of
    one compilation (and one graph) per sequence length.
    """

    steps: int = 200
    lr: float = 6e-4
    warmup_fraction: float = 0.04
    weight_decay: float = 0.0
    clip_norm: float = 1.0
    sequences_per_step: int = 4
    num_anchors: int = 64
    decay: float = DECAY
    objective: str = "dspark"
    eval_every: int = 50
    checkpoint_every: int = 0
    checkpoint_minutes: float = 0.0
    seed: int = 0
    loss_backend: str = "auto"
    loss_chunk_rows: int | None = None
    precision: str = "auto"
    ce_weight: float | None = None
    l1_weight: float | None = None
    dropout: float = 0.0
    step_offset: int = 0
    parallel: str = "auto"
    compile: bool | str = False

    def __post_init__(self):
        if self.objective not in ("dspark", "dflash", "eagle3"):
            raise ValueError(f"objective must be 'dspark', 'dflash' or 'eagle3', got {self.objective!r}")
        if self.objective != "dspark" and (self.ce_weight is not None or self.l1_weight is not None):
            raise ValueError(f"ce_weight and l1_weight apply to the dspark objective, not {self.objective!r}")
        weights = self.loss_weights()
        if not all(math.isfinite(weights[k]) and weights[k] >= 0 for k in ("ce_weight", "l1_weight")) \
                or weights["ce_weight"] + weights["l1_weight"] == 0:
            raise ValueError(f"ce_weight and l1_weight must be finite, non-negative and not both 0, got "
                             f"{weights['ce_weight']} and {weights['l1_weight']}")
        if self.steps < 1 or self.sequences_per_step < 1 or self.num_anchors < 1:
            raise ValueError("steps, sequences_per_step and num_anchors must be positive")
        if self.step_offset < 0:
            raise ValueError(f"step_offset must be >= 0, got {self.step_offset}")
        if self.checkpoint_every < 0 or not self.checkpoint_minutes >= 0:
            raise ValueError(f"checkpoint_every and checkpoint_minutes must be 0 (off) or more, got "
                             f"{self.checkpoint_every} and {self.checkpoint_minutes}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must lie in [0, 1), got {self.dropout}")
        if self.dropout and self.objective == "eagle3":
            raise ValueError("dropout applies to the dspark and dflash objectives, not 'eagle3'")
        if self.precision not in ("auto", "fp32", "bf16"):
            raise ValueError(f"precision must be 'auto', 'fp32' or 'bf16', got {self.precision!r}")
        if self.parallel not in PARALLEL:
            raise ValueError(f"parallel must be one of {', '.join(PARALLEL)}, got {self.parallel!r}")
        if self.compile not in (False, True, "reduce-overhead"):
            raise ValueError(f"compile must be False, True or 'reduce-overhead', got {self.compile!r}")

    def loss_weights(self) -> dict:
        if self.objective in ("dflash", "eagle3"):
            return dict(ce_weight=1.0, l1_weight=0.0, confidence_weight=0.0)
        return dict(ce_weight=CE_WEIGHT if self.ce_weight is None else float(self.ce_weight),
                    l1_weight=L1_WEIGHT if self.l1_weight is None else float(self.l1_weight),
                    confidence_weight=CONFIDENCE_WEIGHT)


# Under torch.compile a step's contexts are padded to a multiple of this many rows: shapes repeat, so the step
# compiles once per bucket instead of once per longest sequence length.
COMPILED_LENGTH_BUCKET = 64


def lr_factor(step: int, config: TrainConfig) -> float:
    """Linear warm-up over the first ``warmup_fraction`` of steps, then cosine to 0."""
    warmup = max(1, round(config.warmup_fraction * config.steps))
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, config.steps - warmup)
    return 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))
