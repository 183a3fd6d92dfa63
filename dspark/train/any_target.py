"""Train a drafter for any local causal LM: ``python -m dspark train --target DIR --prompts FILE --output OUT``.

:func:`train_for_target` runs the pipeline the default target gets, for a model the user brings:

1. the target (a local Hugging Face directory, or a GGUF file inside one) answers the prompts (a JSONL, JSON
   or text file, or a packaged prompt set by name), batched and resumable, its features captured as it
   answers;
2. everything the drafter needs is read from the target's config (layers, widths, heads, RoPE, taps spread
   over its depth, a mask token its tokenizer reserves, the draft vocabulary from its answers) and written to
   ``OUT.work/run.json`` before training starts;
3. the drafter trains, checkpointing every N steps or M minutes, and a rerun of the same command resumes;
4. STS calibrates the confidence head on held-out prompts, and the drafter is written to ``OUT``, where
   :func:`dspark.load` and ``python -m dspark demo --target DIR --drafter OUT`` read it.

Nothing about the default target is assumed: what cannot work (no chat template and no ``plain_text``, a draft
vocabulary larger than the target's, too few prompts, an unreadable prompt file) is a ``ValueError`` that says
what to change.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import torch

from dspark.io import atomic_write_text
from dspark.train.pools import read_prompts


def encode_prompts(target, prompts: list[str | list[dict]], *, plain_text: bool = False) -> list[list[int]]:
    """Token ids the target answers: each prompt through its tokenizer's chat template, or with ``plain_text``
    as plain text (a conversation's turns joined by blank lines), for base models without a template."""
    if target.tokenizer is None:
        raise ValueError("the target has no tokenizer: its directory must hold the tokenizer files")
    if not plain_text and not target.has_chat_template:
        raise ValueError("the target's tokenizer has no chat template (a base model?): pass --plain-text "
                         "(plain_text=True) to feed the prompts as plain text")
    if plain_text:
        return [target.encode(p if isinstance(p, str) else "\n\n".join(m["content"] for m in p)) for p in prompts]
    return [target.encode_chat(p) for p in prompts]


def describe_target(target, path: str | os.PathLike, gguf_file: str | None) -> dict:
    """What the drafter is built from, read from the target's own config: recorded in ``run.json``."""
    config = target.config
    get = lambda name: getattr(config, name, None)  # noqa: E731
    mask = target.mask_token_id()
    return {"path": str(Path(path).resolve()), "gguf_file": gguf_file,
            "architecture": (get("architectures") or [type(target.model).__name__])[0],
            "model_type": get("model_type"), "num_hidden_layers": target.num_layers,
            "hidden_size": target.hidden_size, "vocab_size": target.vocab_size,
            "num_attention_heads": get("num_attention_heads"), "num_key_value_heads": get("num_key_value_heads"),
            "head_dim": get("head_dim"), "sliding_window": target.sliding_window, "tap_layers": target.tap_layers,
            "mask_token_id": mask,
            "mask_token": target.tokenizer.convert_ids_to_tokens(mask) if target.tokenizer is not None else None,
            "eos_token_id": target.eos_token_id, "chat_template": target.has_chat_template}


def default_held_out(num_prompts: int) -> int:
    """Held-out sequences for τ_prob and STS: a tenth of the prompts, at least 1 and at most 48."""
    return max(1, min(48, num_prompts // 10))


def default_draft_vocab(vocab_size: int) -> int | None:
    """The whole vocabulary up to 32,768 tokens (``None``), else the 32,768 most frequent answer tokens: the
    draft LM head is the drafter's largest matrix, and serving engines use reduced heads of that size."""
    return None if vocab_size <= 32768 else 32768


def train_for_target(target_path: str | os.PathLike, prompts: str | os.PathLike, output: str | os.PathLike, *,
                     gguf_file: str | None = None, plain_text: bool = False, num_prompts: int | None = None,
                     max_new_tokens: int = 128, objective: str = "dspark", steps: int = 2000,
                     num_draft_layers: int = 2, block_size: int = 7, markov_rank: int = 32, num_anchors: int = 48,
                     sequences_per_step: int = 4, draft_vocab_size: int | None = None, lr: float = 1e-3,
                     held_out: int | None = None, eval_every: int = 200, checkpoint_every: int = 200,
                     checkpoint_minutes: float = 10.0, precision: str = "auto", seed: int = 0,
                     calibrate: bool = True, keep_checkpoints: bool = False, progress: bool = True) -> Path:
    """Train a DSpark (or DFlash) drafter for the causal LM at ``target_path`` and write it to ``output``.

    Args:
        target_path: a local Hugging Face model directory (config, weights, tokenizer), or the directory of
            ``gguf_file``. Never downloaded.
        prompts: a prompt file or a packaged prompt set (:func:`dspark.train.pools.read_prompts`); the first
            ``num_prompts`` of a seeded shuffle are answered (all by default), greedily, with at most
            ``max_new_tokens`` each.
        plain_text: feed prompts as plain text instead of through the chat template (base models).
        objective: ``dspark`` (Markov and confidence heads, STS) or ``dflash`` (the backbone alone, CE).
        draft_vocab_size: the drafter's vocabulary, the most frequent answer tokens plus EOS; default
            :func:`default_draft_vocab`.
        held_out: sequences kept out of training to measure τ_prob and calibrate STS; default
            :func:`default_held_out`.
        checkpoint_every, checkpoint_minutes: checkpoint after that many steps or minutes, whichever comes
            first; a rerun of the same call resumes from the last one.
        keep_checkpoints: keep ``OUT.work/checkpoint`` after the drafter is written (removed by default).

    The work directory ``OUT.work`` holds ``run.json`` (the target's description and every setting, written
    before anything runs), the answered corpus (kept, so a rerun with more steps does not answer again), the
    training checkpoint and, once training ends, ``history.json`` (every step's row; read it with
    :meth:`dspark.train.history.History.read`). Returns ``output``.
    """
    from dspark.drafter import DSparkDrafter
    from dspark.files.checkpoint import save_drafter
    from dspark.runtime.machine import resolve_precision
    from dspark.runtime.target import load_target
    from dspark.train.answers import answered_corpus
    from dspark.train.config import TrainConfig
    from dspark.train.features import OfflineFeatures
    from dspark.train.trainer import Trainer, calibrate_on_samples, source_commit
    from dspark.vocab import build_draft_vocab, token_counts

    if objective not in ("dspark", "dflash"):
        raise ValueError(f"objective must be 'dspark' or 'dflash' for another target, got {objective!r}")
    if max_new_tokens < 1 or (num_prompts is not None and num_prompts < 2):
        raise ValueError("max_new_tokens must be positive and num_prompts at least 2")
    target_path = Path(target_path)
    resolved = resolve_precision(precision)
    # Refused now rather than after hours of answering.
    TrainConfig(steps=steps, objective=objective, num_anchors=num_anchors, sequences_per_step=sequences_per_step,
                checkpoint_every=checkpoint_every, checkpoint_minutes=checkpoint_minutes, precision=resolved)
    output = Path(output)
    work = output.with_name(output.name + ".work")
    clock: dict[str, float] = {}
    t0 = time.perf_counter()
    texts = read_prompts(prompts)
    target = load_target(target_path, gguf_file)
    answering = target if resolved == "fp32" else load_target(target_path, gguf_file, dtype=torch.bfloat16)
    encoded = encode_prompts(target, texts, plain_text=plain_text)
    count = len(encoded) if num_prompts is None else min(num_prompts, len(encoded))
    held = default_held_out(count) if held_out is None else held_out
    if count <= held:
        raise ValueError(f"{count} prompts are too few: {held} are held out to measure the drafter, so at least "
                         f"{held + 1} are needed (more than a few hundred to train anything useful)")
    vocab_size = default_draft_vocab(target.vocab_size) if draft_vocab_size is None else draft_vocab_size
    if vocab_size is not None and not 0 < vocab_size <= target.vocab_size:
        raise ValueError(f"draft_vocab_size {vocab_size} does not fit the target's vocabulary of "
                         f"{target.vocab_size} tokens")
    settings = {"prompts": str(prompts), "num_prompts": count, "plain_text": plain_text,
                "max_new_tokens": max_new_tokens, "objective": objective, "steps": steps,
                "num_draft_layers": num_draft_layers, "block_size": block_size,
                "markov_rank": markov_rank if objective == "dspark" else 0, "num_anchors": num_anchors,
                "sequences_per_step": sequences_per_step, "draft_vocab_size": vocab_size, "lr": lr,
                "held_out": held, "precision": resolved, "seed": seed}
    run = {"target": describe_target(target, target_path, gguf_file), "settings": settings}
    _record_run(work / "run.json", run)
    if progress:
        print(f"training a {objective} drafter for {run['target']['architecture']} at {target_path} "
              f"({target.num_layers} layers, taps {target.tap_layers}, vocabulary {target.vocab_size:,}); "
              f"writing {output}, work files in {work}")

    samples = answered_corpus(answering, encoded, work / "corpus", count, max_new_tokens=max_new_tokens,
                              progress=progress)
    del answering
    # Samples come by prompt index; the highest indices are held out.
    train, evaluation = samples[:-held], samples[-held:]
    clock["answer"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    torch.manual_seed(seed)
    is_dspark = objective == "dspark"
    drafter = DSparkDrafter(target.drafter_config(
        block_size=block_size, num_draft_layers=num_draft_layers, markov_rank=settings["markov_rank"],
        enable_confidence_head=is_dspark, confidence_head_with_markov=is_dspark, draft_vocab_size=vocab_size))
    if drafter.reduced_vocab:
        answers = [s.token_ids[s.loss_mask] for s in train]
        always = [] if target.eos_token_id is None else [target.eos_token_id]
        drafter.set_draft_vocab(build_draft_vocab(token_counts(answers, target.vocab_size), vocab_size, always))
    drafter.load_target_embeddings(target.embed_weight(), target.lm_head_weight())
    config = TrainConfig(steps=steps, objective=objective, num_anchors=num_anchors, lr=lr,
                         sequences_per_step=sequences_per_step, eval_every=eval_every,
                         checkpoint_every=checkpoint_every, checkpoint_minutes=checkpoint_minutes,
                         precision=resolved, seed=seed)
    source = OfflineFeatures(work / "corpus", target.tap_layers, target.hidden_size)
    trainer = Trainer(drafter, target.lm_head_weight(), source, train, config, held_out=evaluation)
    checkpoint = work / "checkpoint"
    if (checkpoint / "trainer_state.json").exists():
        trainer.resume(checkpoint, target)
    trainer.fit(output_dir=checkpoint, progress=progress)
    clock["train"] = trainer.elapsed
    atomic_write_text(work / "history.json", json.dumps(trainer.history) + "\n")  # dspark.train.history.History.read

    curve = [{k: row[k] for k in ("step", "answer_tokens_seen", "eval_tau_prob", "eval_accuracy")}
             for row in trainer.history if "eval_tau_prob" in row]
    metadata = {"objective": objective, "steps": trainer.step, "train_sequences": len(train),
                "held_out_sequences": len(evaluation),
                "train_answer_tokens": int(sum(int(s.loss_mask.sum()) for s in train)),
                "final": trainer.history[-1] if trainer.history else {}, "curve": curve,
                "run": {**run, "commit": source_commit(), "threads": torch.get_num_threads()}}
    if is_dspark and calibrate:
        t0 = time.perf_counter()
        metadata["sts"] = calibrate_on_samples(target, trainer.drafter.eval(), evaluation, progress=progress)
        clock["calibrate"] = time.perf_counter() - t0
    metadata["run"]["seconds"] = {k: round(v, 1) for k, v in clock.items()}
    path = save_drafter(trainer.drafter, output, dtype=torch.bfloat16, metadata=metadata)
    if not keep_checkpoints:
        shutil.rmtree(checkpoint, ignore_errors=True)
    if progress and curve:
        print(f"held-out τ_prob {curve[0]['eval_tau_prob']:.3f} before training, {curve[-1]['eval_tau_prob']:.3f} "
              f"after {trainer.step} steps")
    return path


def _record_run(path: Path, run: dict) -> None:
    """Write ``run.json``, or check that an interrupted run's matches: a rerun with other settings would mix
    two runs' answers and checkpoints."""
    if path.exists():
        before = json.loads(path.read_text(encoding="utf-8"))
        differ = sorted(k for k in run["settings"] if before.get("settings", {}).get(k) != run["settings"][k])
        if before.get("target") != run["target"]:
            differ.insert(0, "target")
        if differ:
            raise ValueError(f"{path.parent} holds a run started with other settings ({', '.join(differ)}): give "
                             "another --output, or remove it to start over")
        return
    atomic_write_text(path, json.dumps(run, indent=2) + "\n")
