"""Training DSpark (and DFlash-baseline) drafters from a target's hidden states (method.md §3, §8).

* Samples (:mod:`dspark.train.samples`) are token sequences with a loss mask over the assistant's tokens;
  anchors and block targets are cut from them there.
* Hidden states come from a :class:`dspark.train.features.FeatureSource`.
* :class:`Trainer`: AdamW, linear warm-up then cosine to 0, gradient clipping, a progress bar, held-out
  evaluation, atomic safetensors checkpoints and a bit-for-bit resume. A step stacks all of its sequences'
  blocks into one :class:`dspark.train.objective.BlockBatch` and runs one forward, loss and backward
  (:class:`dspark.train.objective.TrainingLoss`); its settings are a :class:`dspark.train.config.TrainConfig`.
  Under ``torch.distributed`` every rank takes its share of each step's sequences, the loss denominator Σw
  is summed over ranks, and DDP or FSDP2 reduce the gradients (:mod:`dspark.train.distributed`), so the update
  equals the single-process one up to the order of floating-point sums.

Anchor sampling draws from a generator seeded by (seed, step, sequence index), so which rank handles a
sequence, and whether the run was resumed, never changes the anchors.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from dspark.drafter import DSparkDrafter
from dspark.files.checkpoint import load_drafter, write_drafter_files
from dspark.io import atomic_directory
from dspark.train.config import COMPILED_LENGTH_BUCKET, TrainConfig, lr_factor
from dspark.train.distributed import (
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
from dspark.train.history import History
from dspark.train.objective import BlockBatch, Chains, TrainingLoss, prepare_blocks
from dspark.train.samples import Sample, sample_anchors

# A resumed run may change these: they set how often it evaluates and saves, and which (equivalent) loss kernel,
# data-parallel engine or compiler runs, not which steps it takes.
RESUME_FREE_SETTINGS = frozenset({"eval_every", "checkpoint_every", "checkpoint_minutes", "loss_backend",
                                  "loss_chunk_rows", "parallel", "compile"})


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
            # In place: parameter names, and so checkpoints, stay those of the eager module.
            self.module.compile(mode="reduce-overhead" if self.config.compile == "reduce-overhead" else None)
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

    def _step_indices(self, step: int) -> list[int]:
        """The places in ``train`` of the sequences of ``step`` (counted in the drafter's whole training)."""
        per = self.config.sequences_per_step
        return [(step * per + i) % len(self.train) for i in range(per)]

    def feature_order(self) -> list[int]:
        """The feature keys that this rank's steps still to run read, each where it is first read: what a
        :class:`dspark.train.streaming.FeatureStream` feeding this trainer should ask for. After
        :meth:`resume` it leaves out what only the steps already taken read, so a restarted consumer asks for
        nothing twice and misses nothing."""
        first = self.config.step_offset + self.step
        keys = [self._feature_key(idx, self.train[idx])
                for step in range(first, self.config.step_offset + self.config.steps)
                for idx in self._step_indices(step)[rank()::world_size()]]
        return list(dict.fromkeys(keys))

    def train_step(self) -> dict:
        """One optimiser step over ``sequences_per_step`` sequences: this rank's share in one forward and backward."""
        world = world_size()
        step = self.config.step_offset + self.step  # the step in the drafter's whole training
        indices = self._step_indices(step)
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
