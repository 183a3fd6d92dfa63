"""Cheap changes to the recipe's training, and the DFlash baseline, each against the recipe and its seed noise.

The recipe's drafter learns slowly: its held-out τ_prob grows by about 0.1 per doubling of the answer
tokens it has seen (paper §7). This benchmark asks whether something cheaper than more data and steps
makes it learn faster, and compares DSpark with DFlash at equal data and steps. Every variant trains the
recipe's drafter (two layers, Markov rank 32 for DSpark, 16,384-token draft vocabulary, 48 anchors per
sequence, 4 sequences a step, AdamW at 1e-3 with warm-up and cosine to 0) from the same initial weights on
the same sequences in the same order, and is evaluated on the same held-out sequences:

* ``recipe``: the recipe's settings; ``recipe-seed1``: the same with another seed for the initial weights
  and anchors, which sizes the noise every difference must clear;
* ``tap-rms``: each tap feature divided by its RMS over the training split before ``fc`` (SmolLM2's late
  layers carry a few massive-activation features far larger than the rest, and AdamW moves every weight of
  ``fc`` by about the same step, so unscaled, those features dominate how a step changes ``fc``'s output);
* ``hidden-l1``, ``hidden-l1x5``: the loss adds λ = 1 or 5 times a smooth-L1 regression of the draft's
  final-normed hidden state onto the target's at the same position (EAGLE's feature loss; the target's
  hidden state is in the corpus already, and the LM head maps both to logits);
* ``init-target``: the two draft layers start from the target's first two decoder layers (q/k norms at 1);
* ``lr-3e-3``: three times the learning rate;
* ``dflash``, ``dflash-seed1``: the DFlash baseline at the same data, steps and draft vocabulary (no
  Markov head, no confidence head, cross-entropy only).

``--study ablations`` (the default) trains the recipe, its second seed and the cheap changes, and writes
``training_ablations_cpu.json``; ``--study objectives`` trains the recipe and the DFlash baseline with two
seeds each, DSpark against DFlash at equal data and steps, and writes ``training_objectives_cpu.json``.

The data are the ``--sequences`` shortest sequences of the recipe's answer archive (short sequences keep a
step cheap), ordered and split as the recipe orders and splits its corpus: the last ``--held-out`` in
that order are held out. Features are rebuilt into the recipe's corpus cache (shared with ``train``).
Runs go two at a time on one thread each (``--jobs``), in fp32 (on CPUs without fast bf16 units fp32 is
the faster of the two; the variants compare with each other, not with the recipe's run). Features come from
the target in :func:`dspark.runtime.machine.fastest_precision` on this machine, and the result records which.

    python benchmarks/bench_ablations.py [--study ablations|objectives] [--steps 250] [--sequences 1056]
                                         [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.environment import write_result  # noqa: E402

VARIANTS = {
    "recipe": {},
    "recipe-seed1": {"seed": 1},
    "tap-rms": {"tap_rms": True},
    "hidden-l1": {"hidden_weight": 1.0},
    "hidden-l1x5": {"hidden_weight": 5.0},
    "init-target": {"init_from_target": True},
    "lr-3e-3": {"lr": 3e-3},
    "dflash": {"objective": "dflash"},
    "dflash-seed1": {"objective": "dflash", "seed": 1},
}
STUDIES = {
    "ablations": ["recipe", "recipe-seed1", "tap-rms", "hidden-l1", "hidden-l1x5", "init-target", "lr-3e-3"],
    "objectives": ["recipe", "recipe-seed1", "dflash", "dflash-seed1"],
}


def select(sequences: int, held_out: int) -> dict:
    """Prompt keys of the ``sequences`` shortest answered sequences, in corpus order, split train / held out."""
    from dspark.train.answers import load_answers
    from dspark.train.corpus import corpus_order

    answers = load_answers(_archive())
    shortest = sorted(range(len(answers.keys)), key=lambda i: len(answers.sequences[i]))[:sequences]
    chosen = {int(answers.keys[i]) for i in shortest}
    order = [k for k in corpus_order(len(_prompts())) if k in chosen]
    if len(order) <= held_out:
        raise ValueError(f"{len(order)} sequences cannot hold out {held_out}")
    return {"train": order[:-held_out], "held_out": order[-held_out:]}


def _archive() -> Path:
    return Path(__file__).resolve().parent / "recipes" / "smollm2_drafter.answers.npz"


def _prompts():
    from dspark.train.pools import load_training_prompts

    return load_training_prompts(None)


def _corpus_dir(precision: str) -> Path:
    from dspark.runtime.target import cache_root
    from dspark.train.pipeline import recipe_corpus_dir

    return recipe_corpus_dir(cache_root() / "training", precision, 192)


def rebuild(keys: list[int], precision: str) -> None:
    from dspark.runtime.target import load_default_target
    from dspark.train.answers import rebuild_corpus

    target = load_default_target(dtype=torch.bfloat16 if precision == "bf16" else torch.float32)
    rebuild_corpus(target, _prompts(), _archive(), _corpus_dir(precision), max_new_tokens=192, keys=keys,
                   progress=True)


def run_variant(name: str, split: dict, steps: int, eval_every: int, features: str) -> dict:
    """Train one variant in this process (one thread) and return its held-out curve."""
    import torch.nn.functional as F

    from dspark.drafter import DSparkDrafter
    from dspark.loss import dspark_loss
    from dspark.runtime.machine import tune_cpu_allocator
    from dspark.runtime.target import load_default_target
    from dspark.train.config import TrainConfig
    from dspark.train.corpus import load_corpus
    from dspark.train.features import OfflineFeatures
    from dspark.train.objective import TrainingLoss
    from dspark.train.trainer import Trainer
    from dspark.vocab import build_draft_vocab, token_counts

    settings = {"objective": "dspark", "seed": 0, "lr": 1e-3, "tap_rms": False, "hidden_weight": 0.0,
                "init_from_target": False, **VARIANTS[name]}
    is_dspark = settings["objective"] == "dspark"
    torch.set_num_threads(1)
    tune_cpu_allocator()
    samples = load_corpus(_corpus_dir(features), split["train"] + split["held_out"])
    train, held_out = samples[:len(split["train"])], samples[len(split["train"]):]
    target = load_default_target()
    torch.manual_seed(settings["seed"])
    config = target.drafter_config(block_size=7, num_draft_layers=2, markov_rank=32 if is_dspark else 0,
                                   enable_confidence_head=is_dspark, confidence_head_with_markov=is_dspark,
                                   draft_vocab_size=16384)
    drafter = DSparkDrafter(config)
    drafter.set_draft_vocab(build_draft_vocab(token_counts([s.token_ids[s.loss_mask] for s in train],
                                                           target.vocab_size), 16384, always=[target.eos_token_id]))
    drafter.load_target_embeddings(target.embed_weight(), target.lm_head_weight())
    source = OfflineFeatures(_corpus_dir(features), target.tap_layers, target.hidden_size)
    if settings["tap_rms"]:
        squares, rows = 0.0, 0
        for sample in train:
            taps, _ = source.features(sample.key, sample)
            squares, rows = squares + taps[1:].double().pow(2).sum(0), rows + taps.shape[0] - 1  # 0: attention sink
        # fc(x / s): a reparameterisation of fc (it could fold 1 / s into its weights), not a new function class
        source = _Scaled(source, (squares / rows).sqrt().float().clamp(min=1e-6))
    if settings["init_from_target"]:
        with torch.no_grad():
            for layer, origin in zip(drafter.layers, target.layers):
                missing, unexpected = layer.load_state_dict(origin.state_dict(), strict=False)
                if unexpected or set(missing) != {"self_attn.q_norm.weight", "self_attn.k_norm.weight"}:
                    raise ValueError(f"target layers do not map onto draft layers: {missing}, {unexpected}")
    weight = settings["hidden_weight"]

    class HiddenRegression(TrainingLoss):
        """The recipe's loss plus ``weight`` × smooth-L1(draft hidden, target hidden) over supervised slots."""

        def forward(self, blocks, normalizer, *, predictions=False):
            with self._autocast():
                hidden, features, conf = self.drafter.training_outputs(
                    blocks.anchor_ids, blocks.anchor_pos, blocks.taps, blocks.next_ids, blocks.block_valid)
            d = hidden.shape[-1]
            out = dspark_loss(
                hidden.reshape(-1, d), self.drafter.lm_head.weight, blocks.target_hidden.reshape(-1, d),
                self.target_lm_head, blocks.labels.reshape(-1), blocks.weights.reshape(-1),
                markov_emb=features.reshape(-1, features.shape[-1]),
                markov_w2=self.drafter.markov_head.markov_w2.weight, confidence_logits=conf.reshape(-1),
                normalizer=normalizer, **self.config.loss_weights())
            regression = F.smooth_l1_loss(hidden.float(), blocks.target_hidden.float(), reduction="none").mean(-1)
            out.loss = out.loss + weight * (regression * blocks.weights).sum() / normalizer
            if predictions:
                logits = self.drafter.lm_head(hidden) + features @ self.drafter.markov_head.markov_w2.weight.T
                return out, logits.argmax(-1)
            return out

    train_config = TrainConfig(steps=steps, objective=settings["objective"], num_anchors=48, lr=settings["lr"],
                               sequences_per_step=4, eval_every=eval_every, precision="fp32", seed=settings["seed"])
    trainer = Trainer(drafter, target.lm_head_weight(), source, train, train_config, held_out=held_out,
                      loss_class=HiddenRegression if weight else TrainingLoss)
    start = time.perf_counter()
    history = trainer.fit(progress=False)
    curve = [{k: row[k] for k in ("step", "answer_tokens_seen", "eval_tau_prob", "eval_accuracy", "eval_ce")}
             for row in history if "eval_tau_prob" in row]
    return {"variant": name, "settings": settings, "seconds": time.perf_counter() - start, "curve": curve}


class _Scaled:
    """A feature source whose taps are divided by ``scale`` (what ``fc`` then sees)."""

    def __init__(self, source, scale: torch.Tensor):
        self.source, self.scale = source, scale

    def features(self, index, sample):
        taps, hidden = self.source.features(index, sample)
        return taps / self.scale, hidden


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=250)
    parser.add_argument("--eval-every", type=int, default=125)
    parser.add_argument("--sequences", type=int, default=1056)
    parser.add_argument("--held-out", type=int, default=48)
    parser.add_argument("--study", choices=list(STUDIES), default="ablations")
    parser.add_argument("--variants", nargs="+", default=None, choices=list(VARIANTS),
                        help="train these instead of the study's variants")
    parser.add_argument("--jobs", type=int, default=2, help="variants trained at once, one thread each")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--features", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.steps < 1 or args.jobs < 1:
        raise SystemExit("--steps and --jobs must be positive")
    split = select(args.sequences, args.held_out)
    if args.worker:
        print(json.dumps(run_variant(args.worker, split, args.steps, args.eval_every, args.features)))
        return 0
    from dspark.runtime.machine import fastest_precision

    features = fastest_precision("cpu")
    rebuild(split["train"] + split["held_out"], features)
    variants = args.variants or STUDIES[args.study]
    runs, pending, started = [], list(variants), time.perf_counter()
    active: list[tuple[str, subprocess.Popen]] = []
    while pending or active:
        while pending and len(active) < args.jobs:
            name = pending.pop(0)
            command = [sys.executable, __file__, "--worker", name, "--steps", str(args.steps), "--eval-every",
                       str(args.eval_every), "--sequences", str(args.sequences), "--held-out", str(args.held_out),
                       "--features", features]
            active.append((name, subprocess.Popen(command, stdout=subprocess.PIPE, text=True)))
        name, process = active.pop(0)
        stdout, _ = process.communicate()
        if process.returncode != 0:
            raise SystemExit(f"variant {name} failed (exit {process.returncode})")
        run = json.loads(stdout.strip().splitlines()[-1])
        runs.append(run)
        final = run["curve"][-1]
        elapsed = time.perf_counter() - started
        eta = elapsed / len(runs) * (len(variants) - len(runs))
        print(f"{name:>14}: tau_prob {final['eval_tau_prob']:.3f}, slot-1 accuracy {final['eval_accuracy'][0]:.3f} "
              f"({run['seconds']:.0f} s; {len(runs)}/{len(variants)} done after {elapsed / 60:.1f} min, "
              f"about {eta / 60:.0f} min left)", flush=True)
    payload = {"steps": args.steps, "sequences": args.sequences, "held_out": args.held_out, "features": features,
               "train_sequences": len(split["train"]), "runs": runs}
    path = write_result(f"training_{args.study}_cpu", payload, args.out)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
