"""Training DSpark (and DFlash-baseline) drafters from a target's hidden states (method.md §3, §8).

* Samples (:mod:`dspark.train.samples`) are token sequences with a loss mask over the assistant's tokens;
  anchors and block targets are cut from them there.
* Hidden states come from a :class:`dspark.train.features.FeatureSource`.
* :class:`Trainer`: AdamW, linear warm-up then cosine to 0, gradient clipping, a progress bar, held-out
  evaluation, atomic safetensors checkpoints and a bit-for-bit resume. A step stacks all of its sequences'
  blocks into one :class:`BlockBatch` and runs one forward, loss and backward (:class:`TrainingLoss`).
  Under ``torch.distributed`` every rank takes its share of each step's sequences, the loss denominator Σw
  is summed over ranks, and DDP or FSDP2 reduce the gradients (:mod:`dspark.train.distributed`), so the update
  equals the single-process one up to the order of floating-point sums.

Anchor sampling draws from a generator seeded by (seed, step, sequence index), so which rank handles a
sequence, and whether the run was resumed, never changes the anchors.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import torch

from dspark.drafter import DSparkDrafter
from dspark.files.checkpoint import load_drafter, write_drafter_files
from dspark.io import atomic_directory
from dspark.loss import CE_WEIGHT, CONFIDENCE_WEIGHT, DECAY, L1_WEIGHT, dspark_loss, position_weights, vocab_product
from dspark.train.distributed import (
    PARALLEL,
    barrier,
    drafter_name,
    full_state,
    full_tensor,
    load_full_state,
    rank,
    resolve_parallel,
    world_size,
    wrap_for_data_parallel,
)
from dspark.train.features import FeatureSource
from dspark.train.samples import Sample, block_targets, sample_anchors


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

    ``compile``: run the step's forward, loss and backward through ``torch.compile`` (the eager step is the
    reference it is tested against). Contexts are then padded to a multiple of :data:`COMPILED_LENGTH_BUCKET`
    rows, so that a few shapes repeat instead of one compilation per sequence length.
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
    compile: bool = False

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

    def loss_weights(self) -> dict:
        if self.objective in ("dflash", "eagle3"):
            return dict(ce_weight=1.0, l1_weight=0.0, confidence_weight=0.0)
        return dict(ce_weight=CE_WEIGHT if self.ce_weight is None else float(self.ce_weight),
                    l1_weight=L1_WEIGHT if self.l1_weight is None else float(self.l1_weight),
                    confidence_weight=CONFIDENCE_WEIGHT)


# Under torch.compile a step's contexts are padded to a multiple of this many rows: shapes repeat, so the step
# compiles once per bucket instead of once per longest sequence length.
COMPILED_LENGTH_BUCKET = 64

# A resumed run may change these: they set how often it evaluates and saves, and which (equivalent) loss kernel,
# data-parallel engine or compiler runs, not which steps it takes.
RESUME_FREE_SETTINGS = frozenset({"eval_every", "checkpoint_every", "checkpoint_minutes", "loss_backend",
                                  "loss_chunk_rows", "parallel", "compile"})


def lr_factor(step: int, config: TrainConfig) -> float:
    """Linear warm-up over the first ``warmup_fraction`` of steps, then cosine to 0."""
    warmup = max(1, round(config.warmup_fraction * config.steps))
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, config.steps - warmup)
    return 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))


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


class History(list):
    """A training run's rows (one per step: loss parts, learning rate, answer tokens seen, seconds; evaluation
    steps add ``eval_tau_prob``, ``eval_accuracy`` and the held-out loss parts), as :meth:`Trainer.fit` returns it.

    It is a plain list of dicts (JSON as it is), with a table of the evaluations and a plot of the curves.
    """

    @classmethod
    def read(cls, path: str | os.PathLike) -> History:
        """The history a run wrote as JSON (``history.json`` in the run directory of ``train --target``)."""
        return cls(json.loads(Path(path).read_text(encoding="utf-8")))

    def evaluations(self) -> list[dict]:
        return [row for row in self if "eval_tau_prob" in row]

    def table(self):
        """The evaluation rows as a :class:`dspark.report.Table`."""
        from dspark.report import Table

        rows = [dict(row, acc1=row["eval_accuracy"][0] if row.get("eval_accuracy") else None)
                for row in self.evaluations()]
        return Table(rows, [("step", "step"), ("answer_tokens_seen", "answer tokens seen"),
                            ("eval_tau_prob", "held-out τ_prob"), ("acc1", "slot-1 accuracy"),
                            ("seconds", "seconds")])

    def _repr_html_(self) -> str:
        return self.table()._repr_html_()

    def plot(self, axes=None):
        """Training loss by step and held-out τ_prob by step, side by side (τ_prob alone for a history of evaluations
        only, such as a drafter's ``curve``); returns the matplotlib axes."""
        import matplotlib.pyplot as plt

        trained = [row for row in self if "loss" in row]
        if axes is None:
            axes = plt.subplots(1, 2 if trained else 1, figsize=(9 if trained else 4.5, 3), squeeze=False)[1][0]
        if trained:
            axes[0].plot([row["step"] for row in trained], [row["loss"] for row in trained])
            axes[0].set(xlabel="step", ylabel="training loss", title="loss")
        evaluated = self.evaluations()
        axes[-1].plot([row["step"] for row in evaluated], [row["eval_tau_prob"] for row in evaluated], "o-")
        axes[-1].set(xlabel="step", ylabel="τ_prob", title="held-out τ_prob (expected tokens per round)")
        return axes


@dataclass
class Trainer:
    """Trains ``drafter`` on ``train`` samples; ``target_lm_head [V, H]`` gives the target's distributions.

    Runs where the drafter's parameters are: features are read on the CPU and each step's blocks moved over.
    A step is one forward, one loss and one backward over all of this rank's sequences (:class:`TrainingLoss`),
    so the work a step issues does not grow with ``sequences_per_step``. Under ``torch.distributed`` the
    module is wrapped by ``DistributedDataParallel`` or FSDP2 (``config.parallel``), which reduce the gradients.
    """

    drafter: DSparkDrafter
    target_lm_head: torch.Tensor
    source: FeatureSource
    train: list[Sample]
    config: TrainConfig
    held_out: list[Sample] = field(default_factory=list)
    step: int = 0
    history: History = field(default_factory=History)
    answer_tokens_seen: int = 0
    elapsed: float = 0.0
    loss_class: type[TrainingLoss] = TrainingLoss
    resumed_from: Path | None = None

    def __post_init__(self):
        if self.config.objective == "dspark" and not self.drafter.config.enable_confidence_head:
            raise ValueError("the dspark objective trains a confidence head: enable it, or use objective='dflash'")
        if (self.config.objective == "eagle3") != (getattr(self.drafter, "architecture", "dspark") == "eagle3"):
            raise ValueError("objective 'eagle3' trains an Eagle3Drafter, and an Eagle3Drafter only that objective")
        target_lm_head = self.target_lm_head.detach()
        self.label_index = None
        if self.drafter.reduced_vocab:
            # With a reduced draft vocabulary the target's distribution is taken over the draft vocabulary
            # (its rows of the LM head, renormalised by the softmax), and slots whose label has no draft id
            # carry no weight.
            from dspark.vocab import target_to_draft

            mapping = self.drafter.draft_to_target
            target_lm_head = target_lm_head[mapping.to(target_lm_head.device)]
            # On the CPU: blocks are cut where the features are read, and moved to the device whole.
            self.label_index = target_to_draft(mapping.cpu(), self.drafter.config.vocab_size)
        self.device = next(self.drafter.parameters()).device
        precision = self.config.precision
        self.low_precision = precision == "bf16" or (precision == "auto" and self.device.type == "cuda")
        target_lm_head = target_lm_head.to(self.device, torch.bfloat16 if self.low_precision else None)
        self.target_lm_head = target_lm_head
        self.parallel = resolve_parallel(self.config.parallel, self.config.sequences_per_step)
        self.module = wrap_for_data_parallel(self.loss_class(self.drafter, target_lm_head, self.config,
                                                             self.low_precision), self.parallel, self.device)
        if self.config.compile:
            self.module.compile()  # in place: parameter names, and so checkpoints, stay those of the eager module
        params = [p for p in self.module.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=self.config.lr, weight_decay=self.config.weight_decay,
                                           betas=(0.9, 0.95))

    def _all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum a step's bookkeeping (loss denominator, reported loss parts) over ranks; gradients are the engine's."""
        if world_size() > 1:
            on_device = torch.distributed.get_backend() == "nccl"
            reduced = tensor.to(self.device) if on_device else tensor
            torch.distributed.all_reduce(reduced)
            tensor = reduced.cpu()
        return tensor

    @staticmethod
    def _feature_key(index: int, sample: Sample) -> int:
        """What a sample's features are stored under: its key, or its place in the list for unkeyed samples."""
        return index if sample.key is None else sample.key

    def _blocks(self, step: int, items: list[tuple[int, Sample]]) -> BlockBatch:
        """The blocks of ``items`` (pairs of index and sample), on the CPU."""
        features = [self.source.features(self._feature_key(index, sample), sample) for index, sample in items]
        blocks = prepare_blocks([sample for _, sample in items], features, self.drafter.config.block_size,
                                self.config.num_anchors, self.config.decay,
                                [self._generator(step, index) for index, _ in items],
                                COMPILED_LENGTH_BUCKET if self.config.compile else 1)
        if self.label_index is not None:
            draft_labels = self.label_index[blocks.labels]
            blocks.weights = blocks.weights * (draft_labels >= 0)
            blocks.labels = draft_labels.clamp(min=0)
        return blocks

    def _chains(self, step: int, index: int, sample: Sample) -> Chains:
        """eagle3's chains in one sequence, anchored where a DSpark step would put its blocks."""
        taps, hidden = self.source.features(self._feature_key(index, sample), sample)
        anchors = self._chain_anchors(step, index, sample)
        return Chains(*(t.to(self.device) for t in (sample.token_ids, sample.loss_mask, taps, hidden, anchors)))

    def _generator(self, step: int, index: int) -> torch.Generator:
        return torch.Generator().manual_seed((self.config.seed * 1_000_003 + (step + 1) * 65_537 + index) % 2**63)

    @contextlib.contextmanager
    def _dropout_masks(self, step: int):
        """Dropout draws its masks from the global generator: within a step it is seeded from the step (and
        rank), in a fork, so a resumed run draws the masks an uninterrupted one would and nothing else sees
        the draws."""
        if not self.config.dropout:
            yield
            return
        devices = [self.device.index or 0] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed((self.config.seed * 1_000_003 + (step + 1) * 65_537 + 7_919 * rank())
                              % 2**63)
            yield

    def _chain_anchors(self, step: int, index: int, sample: Sample) -> torch.Tensor:
        """eagle3 chain anchors: the DSpark block anchors of this step, less position 0 (no feature before it)."""
        anchor_pos, valid = sample_anchors(sample.loss_mask, self.config.num_anchors, self._generator(step, index))
        return anchor_pos[valid & (anchor_pos >= 1)]

    def train_step(self) -> dict:
        """One optimiser step over ``sequences_per_step`` sequences: this rank's share in one forward and backward."""
        world = world_size()
        per = self.config.sequences_per_step
        step = self.config.step_offset + self.step  # the step in the drafter's whole training
        indices = [(step * per + i) % len(self.train) for i in range(per)]
        mine = [(idx, self.train[idx]) for idx in indices[rank()::world]]
        self.answer_tokens_seen += sum(int(self.train[idx].loss_mask.sum()) for idx in indices)
        prefetch = getattr(self.source, "prefetch", None)
        if prefetch is not None:
            prefetch([(self._feature_key(idx, sample), sample) for idx, sample in mine])
        self.module.train()
        self.optimizer.zero_grad()
        if self.config.objective == "eagle3":
            chains = [self._chains(step, idx, sample) for idx, sample in mine]
            # The normaliser counts chains (each supervises its first step), summed over ranks first.
            normalizer = self._all_reduce(torch.tensor(float(sum(c.anchors.numel() for c in chains)),
                                                       dtype=torch.float64))
            outs = self.module(chains, normalizer.to(self.device))
            loss = sum(out.loss for out in outs)
            first_step_ce = sum(out.ce_sums[0] for out in outs) / normalizer.clamp(min=1).to(self.device)
            parts = torch.stack([first_step_ce.double(), *torch.zeros(2, dtype=torch.float64, device=self.device)])
        else:
            blocks = self._blocks(step, mine)
            normalizer = self._all_reduce(blocks.weights.double().sum())
            with self._dropout_masks(step):
                out = self.module(blocks.to(self.device), normalizer.to(self.device))
            loss = out.loss
            parts = torch.stack([out.ce, out.l1, out.bce]).double()
        # The engines average gradients over ranks; each rank's loss is already its share of the global sum.
        (loss * world).backward()
        params = [p for p in self.module.parameters() if p.requires_grad]
        grad_norm = torch.nn.utils.clip_grad_norm_(params, self.config.clip_norm)
        for group in self.optimizer.param_groups:
            group["lr"] = self.config.lr * lr_factor(self.step, self.config)
        self.optimizer.step()
        totals = self._all_reduce(parts.detach().cpu())  # the step's one read of device values
        self.step += 1
        ce, l1, bce = totals.tolist()
        w = self.config.loss_weights()
        # For eagle3, "ce" is the first unrolled step's soft cross-entropy (the one every chain starts with).
        return {"step": self.config.step_offset + self.step, "answer_tokens_seen": self.answer_tokens_seen,
                "loss": w["ce_weight"] * ce + w["l1_weight"] * l1 + w["confidence_weight"] * bce,
                "ce": ce, "l1": l1, "bce": bce, "grad_norm": float(full_tensor(grad_norm)),
                "lr": self.optimizer.param_groups[0]["lr"]}

    @torch.no_grad()
    def evaluate(self, samples: list[Sample] | None = None) -> dict:
        """Held-out loss parts, τ_prob = 1 + Σ_k Π_{i≤k} c*_i (method.md §8) and per-position greedy accuracy.

        For eagle3 the chains are anchored at every supervised position and c*_i is the unrolled step i's.
        Every rank evaluates the same samples (FSDP2 needs every rank in every forward).
        """
        samples = self.held_out if samples is None else samples
        if not samples:
            return {}
        self.module.eval()
        gamma = self.drafter.config.block_size
        totals = {"loss": torch.zeros(3, dtype=torch.float64), "tau": 0.0, "blocks": 0,
                  "correct": torch.zeros(gamma), "counted": torch.zeros(gamma)}
        for j, sample in enumerate(samples):
            if self.config.objective == "eagle3":
                self._evaluate_chains(j, sample, totals)
            else:
                self._evaluate_blocks(j, sample, totals)
        n, loss = len(samples), totals["loss"]
        return {"eval_ce": float(loss[0]) / n, "eval_l1": float(loss[1]) / n, "eval_bce": float(loss[2]) / n,
                "eval_tau_prob": totals["tau"] / max(totals["blocks"], 1),
                "eval_accuracy": (totals["correct"] / totals["counted"].clamp(min=1)).tolist()}

    def _evaluate_blocks(self, j: int, sample: Sample, totals: dict) -> None:
        b = self._blocks(-1, [(j, sample)])  # step -1: a fixed set of held-out anchors
        normalizer = b.weights.double().sum()
        b = b.to(self.device)
        out, greedy = self.module(b, normalizer.to(self.device), predictions=True)
        totals["loss"] += torch.stack([out.ce, out.l1, out.bce]).double().cpu()
        mask = b.weights > 0
        accept = out.acceptance.reshape(mask.shape).float() * mask
        totals["tau"] += float((1 + accept.cumprod(-1).sum(-1))[b.block_valid].sum())
        totals["blocks"] += int(b.block_valid.sum())
        hits = (greedy == b.labels) & mask
        totals["correct"] += hits.float().sum((0, 1)).cpu()
        totals["counted"] += mask.float().sum((0, 1)).cpu()

    def _evaluate_chains(self, j: int, sample: Sample, totals: dict) -> None:
        chains = self._chains(-1, j, sample)  # step -1: a fixed set of held-out anchors
        out, = self.module([chains], torch.tensor(1.0, device=self.device), predictions=True)
        totals["loss"][0] += float(out.ce_sums[0]) / max(1, len(out.mask))
        totals["tau"] += float(out.tau_prob().sum())
        totals["blocks"] += len(out.mask)
        totals["correct"] += (out.hits & out.mask).float().sum(0).cpu()
        totals["counted"] += out.mask.float().sum(0).cpu()

    def fit(self, *, output_dir: str | os.PathLike | None = None, progress: bool = True) -> History:
        """Train to ``config.steps``, evaluating every ``eval_every`` steps and checkpointing if asked.

        The bar shows steps, ETA, the loss, answer tokens trained per second and the latest held-out τ_prob.
        Under ``torch.distributed`` every rank calls it; rank 0 alone shows progress and writes checkpoints.
        """
        bar = None
        if progress and rank() == 0:
            from tqdm.auto import tqdm

            bar = tqdm(total=self.config.steps, initial=self.step, desc="training", unit="step")
        if self.config.eval_every and self.held_out and not self.history:
            # The untrained drafter's numbers start the curve, and the bar shows them from the first step.
            first = {"step": self.config.step_offset, "answer_tokens_seen": self.answer_tokens_seen, **self.evaluate(),
                     "seconds": self.elapsed}
            self.history.append(first)
            if bar:
                bar.set_postfix(tau_prob=f"{first['eval_tau_prob']:.2f}", acc1=f"{first['eval_accuracy'][0]:.2f}")
        if progress and rank() == 0 and self.resumed_from is not None and self.step < self.config.steps:
            print(f"resuming from {self.resumed_from} at step {self.step} of {self.config.steps}")
        start = time.perf_counter() - self.elapsed
        last_checkpoint = time.perf_counter()
        tokens_before, seconds_before = self.answer_tokens_seen, self.elapsed  # this session's rate, not the run's
        while self.step < self.config.steps:
            row = self.train_step()
            if self.config.eval_every and (self.step % self.config.eval_every == 0 or self.step == self.config.steps):
                row.update(self.evaluate())
            row["seconds"] = self.elapsed = time.perf_counter() - start
            self.history.append(row)
            if bar:
                evaluated = next((r for r in reversed(self.history) if "eval_tau_prob" in r), None)
                rate = (self.answer_tokens_seen - tokens_before) / max(self.elapsed - seconds_before, 1e-9)
                shown = {"loss": f"{row['loss']:.3f}", "tok/s": f"{rate:,.0f}"}
                if evaluated is not None:  # the latest held-out numbers stay on the bar between evaluations
                    shown.update(tau_prob=f"{evaluated['eval_tau_prob']:.2f}",
                                 acc1=f"{evaluated['eval_accuracy'][0]:.2f}")
                bar.set_postfix(**shown)
                bar.update(1)
            if output_dir and self._checkpoint_due(last_checkpoint):
                self.save(output_dir)
                last_checkpoint = time.perf_counter()
        if bar:
            bar.close()
        return self.history

    def _checkpoint_due(self, last_checkpoint: float) -> bool:
        """Whether the step just taken ends a checkpoint interval (``checkpoint_every`` steps or
        ``checkpoint_minutes`` since ``last_checkpoint``); every rank gets rank 0's answer, since all take part."""
        every, minutes = self.config.checkpoint_every, self.config.checkpoint_minutes
        due = bool(every and self.step % every == 0) or bool(
            minutes and time.perf_counter() - last_checkpoint >= 60 * minutes)
        if minutes and world_size() > 1:  # clocks differ between ranks; the step count does not
            flag = torch.tensor([float(due)], device=self.device if torch.distributed.get_backend() == "nccl"
                                else "cpu")
            torch.distributed.broadcast(flag, src=0)
            due = bool(flag.item())
        return due

    # -- checkpoints (safetensors + JSON, no pickle)
    def save(self, directory: str | os.PathLike) -> Path:
        """Drafter, optimiser state and step, written atomically; :meth:`resume` continues bit for bit.

        ``trainer_state.json`` also records the run: its config, history (with seconds), world size, engine
        and the commit of the code that trained. Under ``torch.distributed`` every rank calls it (FSDP2's
        shards are gathered into whole tensors first) and rank 0 writes; the files are those of a
        single-process run.
        """
        import safetensors.torch

        weights, optimizer_state = full_state(self.module, self.optimizer)
        if rank() == 0:
            tensors, meta = {}, {"step": self.step, "config": asdict(self.config), "history": self.history,
                                 "answer_tokens_seen": self.answer_tokens_seen, "elapsed": self.elapsed,
                                 "world_size": world_size(), "parallel": self.parallel, "commit": source_commit(),
                                 "groups": [{k: v for k, v in group.items() if k != "params"}
                                            for group in optimizer_state["param_groups"]]}
            for name, state in optimizer_state["state"].items():
                for key, value in state.items():
                    tensors[f"{drafter_name(name)}::{key}"] = value.contiguous()
            with atomic_directory(directory) as tmp:
                write_drafter_files(self.drafter, tmp, metadata={"step": self.step, "objective": self.config.objective},
                                    state={drafter_name(k): v for k, v in weights.items()})
                safetensors.torch.save_file(tensors, tmp / "optimizer.safetensors")
                (tmp / "trainer_state.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
        barrier()
        return Path(directory)

    def resume(self, directory: str | os.PathLike, target=None) -> Trainer:
        """Load what :meth:`save` wrote into this trainer (its drafter, optimiser and step), on every rank.

        Raises ``ValueError`` when the checkpoint's run had other settings than this trainer's, apart from
        :data:`RESUME_FREE_SETTINGS`, which decide when work is done or how, not what the weights become.
        Every rank reads ``directory``: on several nodes it must be on a file system they share.
        """
        import safetensors.torch

        directory = Path(directory)
        meta = json.loads((directory / "trainer_state.json").read_text(encoding="utf-8"))
        mine, saved = asdict(self.config), meta.get("config", {})
        differ = [f"{k}={saved.get(k)!r} there, {v!r} here" for k, v in mine.items()
                  if k not in RESUME_FREE_SETTINGS and saved.get(k, TrainConfig.__dataclass_fields__[k].default) != v]
        if differ:
            raise ValueError(f"{directory} was written by a run with other settings ({'; '.join(differ)}); resuming "
                             f"it would mix two runs: remove it or train elsewhere")
        if target is not None:
            weights = load_drafter(directory, target, dtype=next(self.drafter.parameters()).dtype).state_dict()
        else:
            weights = safetensors.torch.load_file(directory / "model.safetensors")
        per_parameter: dict[str, dict[str, torch.Tensor]] = {}
        for key, value in safetensors.torch.load_file(directory / "optimizer.safetensors").items():
            name, field_name = key.split("::")
            per_parameter.setdefault(name, {})[field_name] = value
        load_full_state(self.module, self.optimizer, weights, per_parameter, meta["groups"])
        self.step = meta["step"]
        self.history = History(meta["history"])
        self.answer_tokens_seen = meta.get("answer_tokens_seen", 0)
        self.elapsed = meta.get("elapsed", 0.0)
        self.resumed_from = directory
        return self


# What measurements write: a change there leaves the code that measures as committed.
MEASUREMENT_OUTPUTS = ("benchmarks/results", "paper/dspark.md", "paper/figures", "paper/provenance.json")


def source_commit(root: str | os.PathLike | None = None) -> str:
    """The git commit of this source tree (or ``root``): ``-dirty`` with uncommitted changes outside the
    measurement outputs, so that one benchmark's fresh results do not mark the next one's; ``unknown`` if
    not a checkout."""
    import subprocess

    root = Path(__file__).resolve().parents[2] if root is None else Path(root)
    outside = [".", *(f":(exclude){path}" for path in MEASUREMENT_OUTPUTS)]
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--", *outside], cwd=root, capture_output=True,
                               text=True).stdout
    except OSError:
        return "unknown"
    return head.stdout.strip() + ("-dirty" if dirty.strip() else "") if head.returncode == 0 else "unknown"


def calibrate_on_samples(target, drafter: DSparkDrafter, samples: list[Sample], max_new_tokens: int = 48,
                         progress: bool = False) -> dict:
    """STS after training (method.md §5.2): held-out prompts (the unmasked prefix of each sample), T = 1."""
    from dspark.runtime.calibrate import calibrate_drafter

    prompts = [s.token_ids[: int(s.loss_mask.nonzero()[0])].tolist() for s in samples if bool(s.loss_mask.any())]
    return calibrate_drafter(target, drafter, prompts, max_new_tokens=max_new_tokens, temperature=1.0,
                             progress=progress)
