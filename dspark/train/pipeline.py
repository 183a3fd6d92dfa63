"""The default target's training pipeline: answered corpora, draft vocabulary, training, calibration.

:func:`train_default_drafter` runs one training run for SmolLM2-135M-Instruct from start to finish (the
target answers ShareGPT prompts and the extra prompt pools, the draft vocabulary is taken from the answers,
:class:`dspark.train.trainer.Trainer` trains, STS calibrates); :func:`answer_pool` grows a pool's answers archive
without training, and :func:`average_drafters` averages continuations of one drafter. A whole schedule of
runs is a recipe (:mod:`dspark.train.recipe`), and the extra prompt pools are data in it
(:class:`dspark.train.pools.PoolSpec`).
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import random
import time
from dataclasses import asdict
from pathlib import Path

import torch

from dspark.drafter import DSparkDrafter
from dspark.files.checkpoint import load_drafter, read_checkpoint_config
from dspark.runtime.machine import resolve_precision
from dspark.train.config import TrainConfig
from dspark.train.features import KeyedFeatures, OfflineFeatures
from dspark.train.pools import PoolSpec
from dspark.train.samples import Sample
from dspark.train.trainer import Trainer, calibrate_on_samples, source_commit

# An extra pool's samples train under their corpus key plus (the pool's place among the run's pools + 1) times
# this, above every ShareGPT key (six-digit file names), so one feature source can route each sample to its corpus.
POOL_KEY_STRIDE = 1_000_000


def recipe_corpus_dir(work: Path, precision: str, max_new_tokens: int, num_prompts: int | None = None) -> Path:
    """Where the recipe caches the corpus the target answered (or rebuilt) in ``precision`` (bf16 or fp32)."""
    return work / (f"corpus-{precision}-{max_new_tokens}" + ("" if num_prompts is None else f"-{num_prompts}"))


def pool_specs(pools: dict[str, dict] | None) -> list[PoolSpec]:
    """The run's extra pools, in the order they join its data, from ``{name: {"source": ..., "count": ...}}``
    (:class:`dspark.train.pools.PoolSpec`); ``ValueError`` for one that cannot be."""
    specs = [PoolSpec.from_dict(name, settings) for name, settings in (pools or {}).items()]
    for spec in specs:
        if spec.answers is not None and not spec.count:
            raise ValueError(f"pool {spec.name!r}: an answers archive is given but count is 0, so it would not "
                             f"be read")
    return specs


def _pool_samples(answering, spec: PoolSpec, prompts: list[str], directory: Path, key_offset: int, *,
                  max_new_tokens: int, progress: bool, lazy_features: bool) -> list[Sample]:
    """The first ``spec.count`` of the pool's ``prompts`` answered into ``directory``
    (:func:`dspark.train.answers.answered_corpus`), keyed from ``key_offset``."""
    from dspark.train.answers import answered_corpus

    if spec.count > len(prompts):
        raise ValueError(f"pool {spec.name!r} asks for {spec.count} prompts, but its source holds {len(prompts)}")
    if not spec.count:
        return []
    samples = answered_corpus(answering, prompts, directory, spec.count, spec.answers, max_new_tokens=max_new_tokens,
                              progress=progress, temperature=spec.temperature, lazy_features=lazy_features)
    return [Sample(s.token_ids, s.loss_mask, key=key_offset + s.key) for s in samples]


def answer_pool(pool: PoolSpec, count: int, archive: str | os.PathLike, *, precision: str | None = None,
                max_new_tokens: int = 192, work_dir: str | os.PathLike | None = None, progress: bool = True) -> dict:
    """Grow the answers archive of the extra prompt pool ``pool`` to its first ``count`` prompts with the default
    target, without training (:func:`dspark.train.answers.grow_answers`).

    The new answers' corpus is written where :func:`train_default_drafter` looks for it under ``work_dir``, so a
    run that names the grown archive (the pool's ``count`` up to ``count``) finds their features on disk and
    rebuilds only those of the answers the archive held before. ``precision``
    (``"auto"``, ``"bf16"`` or ``"fp32"``) is the answering target's; by default the archive's, or ``"auto"`` for a
    new archive, since answers from targets in two dtypes cannot share one corpus. A ``sharegpt-resampled`` pool
    answers the ShareGPT training prompts again, which a run's held-out split decides, so it grows only with
    ``train``. Returns what was done: prompts and answer tokens before and after, and seconds (the archive's manifest
    records each answering run's tokens/s).
    """
    from dspark.runtime.target import cache_root, load_default_target
    from dspark.train.answers import grow_answers, load_answers

    if pool.source == "sharegpt-resampled":
        raise ValueError(f"pool {pool.name!r} answers a run's ShareGPT training prompts again, which the run's "
                         "held-out split decides: `train` answers it")
    if count < 1:
        raise ValueError(f"count must be positive, got {count}")
    archive = Path(archive)
    before = load_answers(archive) if archive.exists() else None
    if precision is None:
        dtype = before.manifest.get("settings", {}).get("target_dtype") if before else None
        precision = {"torch.bfloat16": "bf16", "torch.float32": "fp32"}.get(dtype, "auto")
    resolved = resolve_precision(precision)
    work = Path(work_dir) if work_dir else cache_root() / "training"
    directory = pool.corpus_dir(recipe_corpus_dir(work, resolved, max_new_tokens))
    prompts = pool.prompts([])
    if count > len(prompts):
        raise ValueError(f"pool {pool.name!r} asks for {count} prompts, but its source holds {len(prompts)}")
    start = time.perf_counter()
    answering = load_default_target(dtype=torch.bfloat16 if resolved == "bf16" else torch.float32)
    grown = grow_answers(answering, prompts, count, archive, directory, max_new_tokens=max_new_tokens,
                         progress=progress)
    seconds = time.perf_counter() - start
    return {"pool": pool.name, "archive": str(archive), "corpus": str(directory),
            "prompts_before": len(before.keys) if before else 0, "prompts": len(grown.keys),
            "answer_tokens_before": before.answer_tokens if before else 0, "answer_tokens": grown.answer_tokens,
            "seconds": round(seconds, 1)}


def train_default_drafter(output_dir: str | os.PathLike, *, objective: str = "dspark", num_prompts: int | None = None,
                          corpus_samples: int | None = None, max_new_tokens: int = 192, steps: int = 4000,
                          num_draft_layers: int = 2, markov_rank: int = 32, block_size: int = 7, num_anchors: int = 48,
                          sequences_per_step: int = 4, draft_vocab_size: int | None = 16384, lr: float = 1e-3,
                          precision: str = "auto", held_out: int = 48, eval_every: int = 200,
                          seed: int = 0, ce_weight: float | None = None, l1_weight: float | None = None,
                          dropout: float = 0.0,
                          answers: str | os.PathLike | None = None, pools: dict[str, dict] | None = None,
                          continue_from: str | os.PathLike | None = None,
                          features: str = "eager", work_dir: str | os.PathLike | None = None,
                          calibrate: bool = True, progress: bool = True) -> Path:
    """Train a drafter for SmolLM2-135M-Instruct on ShareGPT prompts answered by the target, on the CPU.

    Phases, each timed into the drafter's metadata (``run.seconds``) and resumable:

    1. ``corpus``: the target (in ``precision``; in bf16 its answers and features differ from the fp32
       target's only by rounding) answers ``num_prompts`` prompts (all ShareGPT first turns of up to 600
       characters by default) greedily, with ``max_new_tokens`` at most, and its features are captured
       while it answers (:func:`dspark.train.corpus.build_corpus`). ``corpus_samples``
       keeps the first that many prompts of the corpus's shuffled order (a time budget that any later run
       can extend). Cached under ``work_dir`` (default ``$DSPARK_CACHE/training``), shared by every objective.
       With ``answers`` (an archive :func:`dspark.train.answers.save_answers` wrote from this corpus), the answers it
       holds are not generated again: their features are rebuilt from it (:func:`dspark.train.answers.rebuild_corpus`,
       by the target in ``precision`` whatever dtype answered), and only prompts it lacks are answered.
       ``pools`` adds extra prompt pools (``{name: {"source": ..., "count": n, ...}}``, a
       :class:`dspark.train.pools.PoolSpec` each: standard-library code, word problems, ShareGPT's later turns,
       the training prompts answered again at a temperature, or a prompt file), each answered into a corpus of
       its own beside the ShareGPT one, its archive read as ``answers`` is. Their samples train beside the
       ShareGPT ones (shuffled in among them) and are never held out, so τ_prob stays measured on the same
       held-out ShareGPT sequences; answers to later turns of a conversation that touches a held-out prompt are
       answered but not trained on (their number is recorded as ``<pool>_held_out_dropped``).
    2. ``vocab``: with ``draft_vocab_size``, the draft vocabulary is the most frequent answer tokens of the
       ShareGPT training split (plus EOS), so adding pools keeps a drafter's vocabulary; its coverage of the
       training, held-out and each extra pool's answers is recorded.
    3. ``train``: :class:`Trainer` for ``steps`` steps of ``sequences_per_step`` sequences, checkpointing every
       ``eval_every`` steps (and resuming from the last checkpoint), evaluating τ_prob on the ``held_out``
       sequences (the highest prompt indices) against the answer tokens seen so far.
    4. ``calibrate`` (DSpark only): STS temperatures from held-out decoding with the fp32 target.

    ``features="lazy"`` leaves the features of archived answers unbuilt in the corpus phase: the answering target
    stays loaded and computes a sample's features when training (or its evaluation) first reads them, storing
    them in the corpus as a rebuild would (:class:`OfflineFeatures` given a target). A run reads at most
    ``steps × sequences_per_step`` training sequences and the held-out ones, so on a corpus larger than that (a
    continuation on grown archives) it pays the target's forward for those alone where ``"eager"`` (the default)
    rebuilds all;
    the features differ from a batched rebuild's only by rounding. The time they take counts in ``train`` and is
    recorded as ``lazy_features``.

    ``precision`` (``bf16``, ``fp32`` or ``auto``) is the answering target's dtype and the training's;
    ``auto`` takes :func:`fastest_precision` on this machine: bf16 is about 2.3× faster than fp32 on CPUs with
    bf16 units and tens of times slower on CPUs without. Corpora of the two precisions are cached apart.

    ``ce_weight`` and ``l1_weight`` (dspark objective only) replace its 0.1·CE + 0.9·L1 mix (see
    :class:`TrainConfig`); a run with either set checkpoints apart from the recipe's.

    ``dropout`` (dspark and dflash objectives) drops that fraction of the backbone's fused context and layer
    outputs in training steps (:attr:`TrainConfig.dropout`); a run with it checkpoints apart too.

    ``seed`` sets the drafter's initial weights and the anchors each step samples; the data and its order do
    not depend on it, so runs that differ only in ``seed`` measure the spread that training noise alone gives.

    The defaults are the committed recipe (``benchmarks/recipes/smollm2_drafter.json``); ``corpus_samples=None``
    answers the whole prompt pool (about 7,700 prompts, two to three hours on 2 cores).

    ``continue_from`` (a drafter this function wrote with the same objective, data and shape, or fewer layers)
    trains that drafter further instead of a new one (it may add pools to the parent's data, the ShareGPT part
    being the same): its weights are loaded (the optimiser's state starts empty), the
    learning-rate schedule starts over (warm-up, then cosine over ``steps`` at ``lr``), and the data order and
    anchors pick up where its training stopped, so no step repeats a block it was trained on
    (:attr:`TrainConfig.step_offset`). The metadata keeps the earlier run (``run.parent``) and one curve over both.
    A ``num_draft_layers`` above the parent's grows it first (:meth:`dspark.backbone.BlockBackbone.grow`): the
    layers added on top start out adding nothing, so the run starts from the parent's predictions.

    ``objective="eagle3"`` drafts the full vocabulary (its chain head has no reduced-vocabulary form), so
    ``draft_vocab_size`` does not apply to it. The drafter is written to ``output_dir`` in bf16 without the
    shared weights.
    """
    from dspark.files.checkpoint import save_drafter
    from dspark.runtime.target import cache_root, load_default_target
    from dspark.train.answers import answered_corpus
    from dspark.train.pools import load_training_prompts

    clock: dict[str, float] = {}
    commit = source_commit()  # the code that trains, not whatever is checked out when the run ends an hour later
    work = Path(work_dir) if work_dir else cache_root() / "training"
    t0 = time.perf_counter()
    resolved = resolve_precision(precision)
    # Refuse bad weights, dropout or pools before the corpus phase, which may take hours.
    TrainConfig(objective=objective, ce_weight=ce_weight, l1_weight=l1_weight, dropout=dropout)
    specs = pool_specs(pools)
    if features not in ("eager", "lazy"):
        raise ValueError(f"features must be 'eager' or 'lazy', got {features!r}")
    lazy = features == "lazy"
    corpus_dir = recipe_corpus_dir(work, resolved, max_new_tokens, num_prompts)
    prompts = load_training_prompts(num_prompts)
    answering = load_default_target(dtype=torch.bfloat16 if resolved == "bf16" else torch.float32)
    samples = answered_corpus(answering, prompts, corpus_dir, corpus_samples, answers,
                              max_new_tokens=max_new_tokens, lazy_features=lazy, progress=progress)
    if len(samples) <= held_out:
        raise ValueError(f"the corpus holds {len(samples)} samples, not more than the {held_out} held out")
    # The held-out sequences are those of the highest prompt indices (samples come by index).
    sharegpt_train_prompts = [prompts[s.key] for s in samples[:-held_out]]
    held_out_prompts = {prompts[s.key] for s in samples[-held_out:]}
    extra, dropped = {}, {}
    for number, spec in enumerate(specs, 1):
        offset = number * POOL_KEY_STRIDE
        answered = _pool_samples(answering, spec, spec.prompts(sharegpt_train_prompts) if spec.count else [],
                                 spec.corpus_dir(corpus_dir), offset, max_new_tokens=max_new_tokens,
                                 progress=progress, lazy_features=lazy)
        excluded = spec.held_out(held_out_prompts) if answered else set()
        extra[spec.name] = [s for s in answered if s.key - offset not in excluded]
        if spec.source == "sharegpt-followups" and answered:
            dropped[spec.name] = len(answered) - len(extra[spec.name])
    feature_target = answering if lazy else None  # computes the features training reads that are not on disk
    del answering
    train, evaluation = samples[:-held_out], samples[-held_out:]
    sharegpt_train = train
    if any(extra.values()):
        # The trainer walks its list in order: shuffled, every pool's blocks come in every stretch of steps.
        train = train + [sample for pool in extra.values() for sample in pool]
        random.Random(0).shuffle(train)
    clock["corpus"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    target = load_default_target()
    is_dspark = objective == "dspark"
    torch.manual_seed(seed)
    vocab_size = draft_vocab_size if objective != "eagle3" else None
    config = target.drafter_config(block_size=block_size, num_draft_layers=num_draft_layers,
                                   markov_rank=markov_rank if is_dspark else 0, enable_confidence_head=is_dspark,
                                   confidence_head_with_markov=is_dspark, draft_vocab_size=vocab_size)
    if objective == "eagle3":
        from dspark.eagle3 import Eagle3Drafter

        drafter = Eagle3Drafter(config)
        with torch.no_grad():
            drafter.init_weights()
    else:
        drafter = DSparkDrafter(config)
    vocab_report = {}
    if drafter.reduced_vocab:
        from dspark.vocab import build_draft_vocab, token_counts

        train_answers = [s.token_ids[s.loss_mask] for s in sharegpt_train]
        mapping = build_draft_vocab(token_counts(train_answers, target.vocab_size), vocab_size,
                                    always=[target.eos_token_id])
        drafter.set_draft_vocab(mapping)
        vocab_report = {"draft_vocab_size": vocab_size,
                        "train_coverage": _coverage(train_answers, mapping, target.vocab_size),
                        "held_out_coverage": _coverage([s.token_ids[s.loss_mask] for s in evaluation], mapping,
                                                       target.vocab_size)}
        for what, pool in extra.items():
            if pool:
                vocab_report[f"{what}_coverage"] = _coverage([s.token_ids[s.loss_mask] for s in pool], mapping,
                                                             target.vocab_size)
    drafter.load_target_embeddings(target.embed_weight(), target.lm_head_weight())
    parent = None
    if continue_from is not None:
        parent = _load_parent(continue_from, drafter, target, objective=objective, num_prompts=num_prompts,
                              corpus_samples=corpus_samples, max_new_tokens=max_new_tokens,
                              draft_vocab_size=draft_vocab_size, held_out=held_out, precision=resolved,
                              answers=None if answers is None else Path(answers).name)
    clock["vocab"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    sources = {0: OfflineFeatures(corpus_dir, target.tap_layers, target.hidden_size, target=feature_target),
               **{number * POOL_KEY_STRIDE: OfflineFeatures(spec.corpus_dir(corpus_dir), target.tap_layers,
                                                            target.hidden_size, target=feature_target)
                  for number, spec in enumerate(specs, 1) if extra[spec.name]}}
    source = KeyedFeatures(sources) if len(sources) > 1 else sources[0]
    train_config = TrainConfig(steps=steps, objective=objective, num_anchors=num_anchors, lr=lr,
                               sequences_per_step=sequences_per_step, eval_every=eval_every,
                               checkpoint_every=eval_every, precision=resolved, seed=seed,
                               ce_weight=ce_weight, l1_weight=l1_weight, dropout=dropout,
                               step_offset=0 if parent is None else parent["steps"])
    trainer = Trainer(drafter, target.lm_head_weight(), source, train, train_config, held_out=evaluation)
    name = f"checkpoint-{objective}-layers{num_draft_layers}-block{block_size}-steps{steps}-" \
           f"vocab{vocab_size or 'full'}-{len(samples)}seq-{resolved}" + (f"-seed{seed}" if seed else "") + \
           loss_weights_suffix(ce_weight, l1_weight) + (f"-dropout{dropout:g}" if dropout else "") + \
           "".join(f"-{spec.name}{spec.count}" + (f"-t{spec.temperature:g}" if spec.temperature else "")
                   for spec in specs if spec.count)
    if parent is not None:
        trainer.answer_tokens_seen = parent["final"].get("answer_tokens_seen", 0)
        name += f"-after{parent['steps']}-{parent['digest']}"
    # Settings the name does not spell out still decide the weights: runs that differ in them must not share (and
    # resume) one checkpoint.
    unnamed = {"lr": lr, "num_anchors": num_anchors, "sequences_per_step": sequences_per_step,
               "markov_rank": markov_rank, "max_new_tokens": max_new_tokens, "held_out": held_out}
    name += "-run" + hashlib.sha256(json.dumps(unnamed, sort_keys=True).encode()).hexdigest()[:8]
    checkpoint = work / name
    if (checkpoint / "trainer_state.json").exists():
        trainer.resume(checkpoint, target)
    trainer.fit(output_dir=checkpoint, progress=progress)
    clock["train"] = trainer.elapsed  # over every session of a resumed run

    arguments = {"objective": objective, "num_prompts": num_prompts, "corpus_samples": corpus_samples,
                 "max_new_tokens": max_new_tokens,
                 "steps": steps, "num_draft_layers": num_draft_layers, "markov_rank": markov_rank,
                 "block_size": block_size, "num_anchors": num_anchors, "sequences_per_step": sequences_per_step,
                 "draft_vocab_size": draft_vocab_size, "lr": lr, "precision": precision, "held_out": held_out,
                 "eval_every": eval_every, "seed": seed, "ce_weight": ce_weight, "l1_weight": l1_weight,
                 "dropout": dropout,
                 "calibrate": calibrate,
                 "answers": None if answers is None else Path(answers).name,
                 "pools": [spec.record() for spec in specs],
                 "features": features, "continue_from": None if parent is None else parent["directory"]}
    curve = [{k: row[k] for k in ("step", "answer_tokens_seen", "eval_tau_prob", "eval_accuracy")}
             for row in trainer.history if "eval_tau_prob" in row]
    if parent is not None:  # its last point and this run's first are the same weights (this one rounded to bf16)
        curve = parent["curve"] + curve[1:]
    metadata = {"objective": objective, "steps": train_config.step_offset + trainer.step,
                "train_sequences": len(train),
                **{f"{name}_sequences": len(pool) for name, pool in extra.items()},
                **{f"{name}_held_out_dropped": count for name, count in dropped.items()},
                "held_out_sequences": len(evaluation),
                "train_answer_tokens": int(sum(int(s.loss_mask.sum()) for s in train)),
                "final": trainer.history[-1] if trainer.history else {}, "vocab": vocab_report,
                "curve": curve,
                **({"lazy_features": {"built": sum(s.built for s in sources.values()),
                                      "seconds": round(sum(s.build_seconds for s in sources.values()), 1)}}
                   if lazy else {}),
                "run": {"arguments": arguments, "train_config": asdict(train_config), "commit": commit,
                        "threads": torch.get_num_threads()}}
    if parent is not None:
        metadata["run"]["parent"] = {"directory": parent["directory"], "steps": parent["steps"],
                                     "layers": parent["layers"], "final": parent["final"], "run": parent["run"]}
    if is_dspark and calibrate:
        t0 = time.perf_counter()
        metadata["sts"] = calibrate_on_samples(target, trainer.drafter.eval(), trainer.held_out,
                                               progress=progress)
        clock["calibrate"] = time.perf_counter() - t0
    metadata["run"]["seconds"] = {k: round(v, 1) for k, v in clock.items()}
    # Results measured before this moment used an earlier drafter; a copied or checked-out file's mtime cannot say.
    metadata["trained_at"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    return save_drafter(trainer.drafter, output_dir, dtype=torch.bfloat16, metadata=metadata)


def _load_parent(directory: str | os.PathLike, drafter, target, **expected) -> dict:
    """Load the drafter at ``directory`` into ``drafter`` (a new one of the recipe's shape, its draft vocabulary
    installed) and return what a continuation records of it, after checking that it was trained on the same
    data with the same objective. Raises ``ValueError`` otherwise."""
    directory = Path(directory)
    meta = read_checkpoint_config(directory).get("metadata", {})
    arguments = meta.get("run", {}).get("arguments")
    if not arguments or "steps" not in meta:
        raise ValueError(f"{directory} holds no training record: only a drafter the recipe trained can be continued")
    recorded = {**arguments, "precision": meta["run"].get("train_config", {}).get("precision")}
    differ = {k: (recorded.get(k), v) for k, v in expected.items() if recorded.get(k) != v}
    if differ:
        raise ValueError(f"{directory} was trained otherwise (recorded, asked): {differ}")
    loaded = load_drafter(directory, target)
    layers = drafter.config.num_draft_layers
    if dict(loaded.config.to_dict(), num_draft_layers=layers) != drafter.config.to_dict() \
            or loaded.config.num_draft_layers > layers:
        raise ValueError(f"{directory} has another shape than the drafter asked for: continue it with its own "
                         "block size and Markov rank, and at least its number of layers")
    grown_from = loaded.config.num_draft_layers
    loaded.grow(layers)
    if drafter.reduced_vocab and not torch.equal(loaded.draft_to_target, drafter.draft_to_target):
        raise ValueError(f"{directory} drafts another vocabulary than this data gives")
    drafter.load_state_dict(loaded.state_dict())
    digest = hashlib.sha256((directory / "model.safetensors").read_bytes()).hexdigest()[:12]
    return {"directory": directory.name, "steps": int(meta["steps"]), "final": meta.get("final", {}),
            "curve": meta.get("curve", []), "run": meta["run"], "digest": digest, "layers": grown_from}


def recipe_sharegpt_split(arguments: dict, precision: str, work_dir: str | os.PathLike | None = None,
                          answers: str | os.PathLike | None = None) -> tuple[Path, list[Sample], list[Sample]]:
    """The ShareGPT corpus directory, training samples and held-out samples of a recipe run with these training
    ``arguments`` (as a drafter's metadata records them) and resolved ``precision``, read from the cache under
    ``work_dir`` (default ``$DSPARK_CACHE/training``), or from the run's answers archive ``answers`` where the cache
    lacks some (a run with ``features="lazy"`` stores only the features it read; :class:`OfflineFeatures` given a
    target computes the others). Raises ``ValueError`` when neither holds them."""
    from dspark.runtime.target import cache_root
    from dspark.train.answers import load_answers
    from dspark.train.corpus import corpus_order, load_corpus, sample_path
    from dspark.train.pools import load_training_prompts

    work = Path(work_dir) if work_dir else cache_root() / "training"
    corpus = recipe_corpus_dir(work, precision, arguments["max_new_tokens"], arguments["num_prompts"])
    order = corpus_order(len(load_training_prompts(arguments["num_prompts"])))[: arguments["corpus_samples"]]
    missing = [k for k in order if not sample_path(corpus, k).exists()]
    if missing and answers is None:
        raise ValueError(f"{corpus} lacks {len(missing)} of the run's {len(order)} ShareGPT samples: run its recipe "
                         "first (python -m dspark train --config ...), which answers or rebuilds them")
    # The recipe holds out the highest prompt indices (samples come by index).
    samples = load_answers(answers).samples(order) if missing else load_corpus(corpus, order)
    held_out = arguments["held_out"]
    return corpus, samples[:-held_out], samples[-held_out:]


# Averaged drafters must agree on these, so that one held-out split and one shape serve them all.
_AVERAGE_SAME = ("objective", "num_prompts", "corpus_samples", "max_new_tokens", "held_out", "draft_vocab_size",
                 "num_anchors")


def average_drafters(directories: list[str | os.PathLike], output_dir: str | os.PathLike, *, target=None,
                     work_dir: str | os.PathLike | None = None, calibrate: bool = True,
                     progress: bool = True) -> Path:
    """Write the mean of the weights of recipe drafters that continued one parent (a "model soup").

    Continuations of one drafter stay close to it (a 4,000-step continuation moves each weight matrix by about a
    tenth of its norm), so their mean is itself a drafter, and it may predict held-out text better than each of
    them: averaging keeps what the runs learned in common and cancels part of what each fitted to its own
    batches (for the shipped drafter's continuations it scored within seed noise of the best; paper §7). The
    drafters must share shape, draft vocabulary, objective and held-out split, so that the mean is scored on
    sequences none of them trained on: its held-out τ_prob, CE and slot accuracies (training's evaluation) are
    recorded as ``final``, each ingredient's own under ``average_of``, and ``steps`` is the most any ingredient
    took. The confidence head is averaged too; with ``calibrate`` its STS temperatures are fitted again on
    held-out decoding, since each ingredient's fit its own head (without it they are the ingredients' mean).
    Written in bf16 without the shared weights, as training writes. Raises ``ValueError`` for fewer than two
    drafters or drafters that differ in any of that.
    """
    from dspark.files.checkpoint import SHARED, save_drafter
    from dspark.runtime.target import load_default_target

    directories = [Path(d) for d in directories]
    if len(directories) < 2:
        raise ValueError(f"averaging needs at least two drafters, got {len(directories)}")
    metas = []
    for directory in directories:
        meta = read_checkpoint_config(directory).get("metadata", {})
        if not meta.get("run", {}).get("arguments") or "steps" not in meta:
            raise ValueError(f"{directory} holds no training record: only drafters the recipe trained can be averaged")
        metas.append(meta)
    first = metas[0]["run"]
    precision = first["train_config"]["precision"]
    for directory, meta in zip(directories[1:], metas[1:]):
        run = meta["run"]
        differ = {k: (first["arguments"].get(k), run["arguments"].get(k)) for k in _AVERAGE_SAME
                  if first["arguments"].get(k) != run["arguments"].get(k)}
        if run["train_config"]["precision"] != precision:
            differ["precision"] = (precision, run["train_config"]["precision"])
        if differ:
            raise ValueError(f"{directory} was trained otherwise than {directories[0]} (first, this): {differ}")
    target = target if target is not None else load_default_target()
    drafters = [load_drafter(d, target) for d in directories]
    for directory, drafter in zip(directories[1:], drafters[1:]):
        if drafter.config.to_dict() != drafters[0].config.to_dict():
            raise ValueError(f"{directory} has another shape than {directories[0]}")
        if drafter.reduced_vocab and not torch.equal(drafter.draft_to_target, drafters[0].draft_to_target):
            raise ValueError(f"{directory} drafts another vocabulary than {directories[0]}")
    mean = drafters[0]
    states = [d.state_dict() for d in drafters]
    with torch.no_grad():
        for name, value in states[0].items():
            # The shared weights are the target's in every ingredient; the draft vocabulary map is not a weight.
            if value.is_floating_point() and name not in SHARED:
                value.copy_(torch.stack([state[name].float() for state in states]).mean(0))
    corpus, _, held = recipe_sharegpt_split(first["arguments"], precision, work_dir)
    source = OfflineFeatures(corpus, target.tap_layers, target.hidden_size)
    config = TrainConfig(num_anchors=first["arguments"]["num_anchors"], precision=precision,
                         objective=first["arguments"]["objective"])
    final = Trainer(mean, target.lm_head_weight(), source, held, config, held_out=held).evaluate()
    # The mean trained on every ingredient's pools: bench_generalization scores it on each of them.
    largest: dict[str, dict] = {}
    for meta in metas:
        for pool in meta["run"]["arguments"].get("pools", []):
            if pool.get("count", 0) > largest.get(pool["name"], {}).get("count", 0):
                largest[pool["name"]] = pool
    arguments = dict(first["arguments"], continue_from=None, pools=list(largest.values()))
    metadata = {"objective": arguments["objective"], "steps": max(int(m["steps"]) for m in metas),
                "held_out_sequences": len(held), "final": final,
                "average_of": [{"directory": d.name, "steps": int(m["steps"]), "final": m.get("final", {})}
                               for d, m in zip(directories, metas)],
                "run": {"arguments": arguments, "train_config": first["train_config"], "commit": source_commit()}}
    if mean.config.enable_confidence_head and calibrate:
        metadata["sts"] = calibrate_on_samples(target, mean.eval(), held, progress=progress)
    metadata["trained_at"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    return save_drafter(mean, output_dir, dtype=torch.bfloat16, metadata=metadata)


def loss_weights_suffix(ce_weight: float | None = None, l1_weight: float | None = None) -> str:
    """What names a run with the dspark objective's weights replaced: ``""`` for the recipe's, else
    ``-ce{ce}-l1_{l1}`` (``-ce1-l1_0`` for cross-entropy alone)."""
    if ce_weight is None and l1_weight is None:
        return ""
    weights = TrainConfig(ce_weight=ce_weight, l1_weight=l1_weight).loss_weights()
    return f"-ce{weights['ce_weight']:g}-l1_{weights['l1_weight']:g}"


def _coverage(answers: list[torch.Tensor], mapping: torch.Tensor, vocab_size: int) -> float:
    """The fraction of ``answers``' tokens that the draft vocabulary ``mapping`` holds."""
    inside = torch.zeros(vocab_size, dtype=torch.bool)
    inside[mapping] = True
    tokens = torch.cat(answers) if answers else torch.zeros(0, dtype=torch.long)
    return float(inside[tokens].float().mean()) if tokens.numel() else float("nan")
