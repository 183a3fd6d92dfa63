"""A corpus's answers archive: the corpus without its features, and the corpus rebuilt from it.

The token ids of a million answer tokens take a few MB where their bf16 features take tens of GB, so a corpus
(:mod:`dspark.train.corpus`) can be kept with the code as its answers and its features recomputed when a run
needs them.

* :func:`save_answers` writes a corpus's token ids and manifest into one compressed ``.npz``; :func:`load_answers`
  reads it back (no pickle) as :class:`Answers`.
* :func:`rebuild_corpus` turns an archive back into the corpus with one forward per batch of whole sequences,
  about 4× faster than answering again on a 2-core CPU.
* :func:`answered_corpus` is what training calls: the first ``count`` prompts answered, from the archive where it
  holds them (rebuilt, or left for the feature reader to compute) and by the target where it does not.
* :func:`grow_answers` extends an archive to more prompts, answering only those it lacks.

Under ``torch.distributed`` every rank rebuilds its share, and :func:`answered_corpus` waits for all ranks before
reading.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

import torch

from dspark.io import atomic_write, atomic_write_text
from dspark.train.corpus import (
    CorpusReport,
    build_corpus,
    corpus_order,
    corpus_settings,
    encode_prompt,
    load_corpus,
    manifest_lock,
    open_manifest,
    sample_path,
    write_sample,
)
from dspark.train.distributed import barrier, rank, world_size
from dspark.train.samples import Sample


@dataclass
class Answers:
    """A corpus without its features (what :func:`save_answers` writes): per sample its prompt index ``key``,
    its token ids (prompt then answer) and where its answer starts, and the corpus's manifest (settings and
    the answering runs' record)."""

    manifest: dict
    keys: list[int]
    sequences: list[torch.Tensor]
    answer_starts: list[int]

    @property
    def answer_tokens(self) -> int:
        return sum(len(s) - a for s, a in zip(self.sequences, self.answer_starts))

    def samples(self, keys: Collection[int] | None = None) -> list[Sample]:
        """The answers of prompt indices ``keys`` (default: all), by index, as :func:`load_corpus` gives a corpus's
        samples: token ids and a loss mask over the answer, keyed by prompt index (no features)."""
        selected = None if keys is None else set(keys)
        samples = []
        for key, sequence, start in zip(self.keys, self.sequences, self.answer_starts):
            if selected is None or key in selected:
                mask = torch.zeros(len(sequence), dtype=torch.bool)
                mask[start:] = True
                samples.append(Sample(sequence, mask, key=key))
        if selected is not None and len(samples) != len(selected):
            raise ValueError(f"the archive lacks {len(selected) - len(samples)} of the {len(selected)} answers "
                             "asked for")
        return sorted(samples, key=lambda sample: sample.key)


def save_answers(directory: str | os.PathLike, path: str | os.PathLike, keys: list[int] | None = None,
                 base: Answers | None = None) -> Path:
    """Store the corpus under ``directory`` without its features, compressed into one ``.npz`` at ``path``.

    The token ids of a million answer tokens take a few MB where their bf16 features take tens of GB, so the
    answers can be kept with the code and the features rebuilt from them by :func:`rebuild_corpus`: one
    batched forward per batch of sequences instead of one decode step per answer token. ``keys`` keeps only
    those prompt indices; each is taken from ``base`` (an archive of this corpus, as :func:`load_answers`
    reads it) where that holds it, else from disk. The manifest is the directory's. Written atomically; read
    back with ``allow_pickle=False``.
    """
    import numpy as np

    directory, path = Path(directory), Path(path)
    if not (directory / "corpus.json").exists():
        raise ValueError(f"{directory} holds no corpus (no corpus.json)")
    wanted = None if keys is None else set(keys)
    entries = [] if base is None else [(key, sequence, start)
                                       for key, sequence, start in zip(base.keys, base.sequences, base.answer_starts)
                                       if wanted is None or key in wanted]
    taken = {key for key, _, _ in entries}
    if keys is None:
        from_disk = [sample for sample in load_corpus(directory) if sample.key not in taken]
    else:
        missing = [key for key in keys if key not in taken]
        from_disk = load_corpus(directory, missing) if missing else []
    for sample in from_disk:
        start = int(sample.loss_mask.long().argmax()) if bool(sample.loss_mask.any()) else len(sample.token_ids)
        if not bool(sample.loss_mask[start:].all()) or bool(sample.loss_mask[:start].any()):
            raise ValueError(f"sample {sample.key}: its loss mask is not a prompt followed by an answer")
        entries.append((sample.key, sample.token_ids, start))
    if not entries:
        raise ValueError(f"{directory} holds no samples")
    entries.sort(key=lambda entry: entry[0])
    ids = torch.cat([sequence for _, sequence, _ in entries])
    id_dtype = np.uint16 if int(ids.max()) < 2 ** 16 else np.int32
    lengths = torch.tensor([len(sequence) for _, sequence, _ in entries])
    manifest = json.loads((directory / "corpus.json").read_text(encoding="utf-8"))
    arrays = {"keys": np.array([key for key, _, _ in entries], dtype=np.int64),
              "offsets": np.concatenate([[0], np.cumsum(lengths.numpy())]).astype(np.int64),
              "answer_starts": np.array([start for _, _, start in entries], dtype=np.int64),
              "token_ids": ids.numpy().astype(id_dtype), "manifest": np.array(json.dumps(manifest))}

    def write(tmp: str) -> None:
        with open(tmp, "wb") as f:
            np.savez_compressed(f, **arrays)

    atomic_write(path, write)
    return path


def load_answers(path: str | os.PathLike) -> Answers:
    """What :func:`save_answers` wrote (no pickle is loaded)."""
    import numpy as np

    path = Path(path)
    if not path.exists():
        raise ValueError(f"no answers archive at {path}")
    with np.load(path, allow_pickle=False) as data:
        missing = {"keys", "offsets", "answer_starts", "token_ids", "manifest"} - set(data.files)
        if missing:
            raise ValueError(f"{path} is not an answers archive: it lacks {sorted(missing)}")
        keys, offsets, starts = data["keys"].tolist(), data["offsets"], data["answer_starts"].tolist()
        ids = torch.from_numpy(data["token_ids"].astype(np.int64))
        manifest = json.loads(str(data["manifest"]))
    if len(offsets) != len(keys) + 1 or int(offsets[-1]) != len(ids) or len(starts) != len(keys):
        raise ValueError(f"{path}: keys, offsets and token ids disagree in length")
    sequences = [ids[int(a): int(b)] for a, b in zip(offsets[:-1], offsets[1:])]
    return Answers(manifest, keys, sequences, starts)


def rebuild_corpus(target, prompts: list[str] | list[list[int]], answers: str | os.PathLike,
                   directory: str | os.PathLike, *, max_new_tokens: int = 192, keys: list[int] | None = None,
                   batch_size: int = 32, dtype: torch.dtype = torch.bfloat16, seed: int = 0,
                   temperature: float = 0.0, progress: bool = True) -> CorpusReport:
    """Rebuild under ``directory`` the corpus whose answers :func:`save_answers` stored at ``answers``.

    ``target``, ``prompts`` and the settings (``temperature`` included) must be those the corpus was answered with
    (the settings :func:`build_corpus` records are compared, and every prompt is re-encoded and compared with the
    stored one), so the result is the corpus :func:`build_corpus` would write, with features from one forward over
    each whole sequence instead of a prefill and one decode step per answer token (the same features up to
    rounding). The target may run in another dtype than the one that answered (fp32 on a CPU that emulates bf16):
    its features then differ from the answering target's by rounding, and the manifest records its dtype as
    ``features_target_dtype``. ``keys`` keeps only those prompt indices. Resumable: samples on disk are kept. The
    manifest keeps the answering runs' record and adds this rebuild to its ``rebuilds``. Returns the answer tokens
    rebuilt and the time. Under ``torch.distributed`` this rank rebuilds its share, as :func:`build_corpus` answers.
    """
    if batch_size < 1:
        raise ValueError("batch_size must be positive")
    directory = Path(directory)
    stored, manifest = _open_archive(target, prompts, answers, directory, max_new_tokens=max_new_tokens, seed=seed,
                                     dtype=dtype, temperature=temperature)
    wanted = None if keys is None else set(keys)
    barrier()  # as in build_corpus: every rank lists the disk before any writes
    todo = [i for i, key in enumerate(stored.keys)
            if (wanted is None or key in wanted) and not sample_path(directory, key).exists()]
    _check_prompts(target, prompts, stored, todo)
    report = CorpusReport(0, 0, 0.0, len(stored.keys) - len(todo), False)
    # Sorted by length before it is dealt out, so every rank gets as many long sequences as the others.
    todo = sorted(todo, key=lambda i: len(stored.sequences[i]))[rank()::world_size()]
    bar = None
    if progress and rank() == 0:
        from tqdm.auto import tqdm

        bar = tqdm(total=sum(len(stored.sequences[i]) for i in todo), desc="rebuilding features", unit="tok",
                   dynamic_ncols=True)
    start = time.perf_counter()
    for b0 in range(0, len(todo), batch_size):
        batch = todo[b0: b0 + batch_size]
        width = max(len(stored.sequences[i]) for i in batch)
        ids = torch.zeros(len(batch), width, dtype=torch.long)
        valid = torch.zeros(len(batch), width, dtype=torch.bool)
        for row, i in enumerate(batch):
            ids[row, : len(stored.sequences[i])] = stored.sequences[i]
            valid[row, : len(stored.sequences[i])] = True
        taps, hidden = target.features(ids, valid)
        for row, i in enumerate(batch):
            n, key = len(stored.sequences[i]), stored.keys[i]
            write_sample(directory, key, stored.sequences[i].tolist(), stored.answer_starts[i], taps[row, :n].cpu(),
                          hidden[row, :n].cpu(), dtype)
            report.samples_written += 1
            report.answer_tokens += n - stored.answer_starts[i]
        report.seconds = time.perf_counter() - start
        if bar is not None:
            bar.update(int(valid.sum()))
            bar.set_postfix(samples=report.samples_total + report.samples_written,
                            answer_tok_s=f"{report.tokens_per_second:.0f}")
    if bar is not None:
        bar.close()
    report.samples_total += report.samples_written
    if report.samples_written:
        with manifest_lock(directory):
            recorded = json.loads(manifest.read_text(encoding="utf-8"))
            recorded.setdefault("rebuilds", []).append(
                {"from": Path(answers).name, "samples_written": report.samples_written,
                 "answer_tokens": report.answer_tokens, "seconds": round(report.seconds, 1),
                 "batch_size": batch_size})
            atomic_write_text(manifest, json.dumps(recorded, indent=2) + "\n")
    return report


def _open_archive(target, prompts: list[str] | list[list[int]], answers: str | os.PathLike, directory: Path, *,
                  max_new_tokens: int, seed: int = 0, dtype: torch.dtype = torch.bfloat16, temperature: float = 0.0,
                  same_dtype: bool = False) -> tuple[Answers, Path]:
    """The archive at ``answers``, checked against the settings given here, and the corpus under ``directory``
    opened with its record (:func:`open_manifest`). Its target dtype may differ from ``target``'s unless
    ``same_dtype`` (features computed by a target in another dtype differ only by rounding, and the corpus records
    that dtype as ``features_target_dtype``; new answers would be another corpus). Returns the archive and the
    corpus manifest's path."""
    stored = load_answers(answers)
    # Which dtype computed an archive's features says nothing about its answers.
    recorded = {k: v for k, v in stored.manifest.get("settings", {}).items() if k != "features_target_dtype"}
    expected = corpus_settings(target, prompts, max_new_tokens, seed, dtype, temperature)
    differ = sorted(k for k in set(recorded) | set(expected) if recorded.get(k) != expected.get(k))
    if differ and (same_dtype or differ != ["target_dtype"]):
        raise ValueError(f"the answers at {answers} were made with other settings (differing: {differ}); "
                         "use the target and settings that answered them, or answer these prompts anew")
    settings = {**recorded, "features_target_dtype": expected["target_dtype"]} if differ else recorded
    directory.mkdir(parents=True, exist_ok=True)
    return stored, open_manifest(directory, settings, stored.manifest)


def answered_corpus(target, prompts: list[str] | list[list[int]], directory: str | os.PathLike,
                    count: int | None = None, answers: str | os.PathLike | None = None, *,
                    max_new_tokens: int = 192, temperature: float = 0.0, lazy_features: bool = False,
                    progress: bool = True) -> list[Sample]:
    """The first ``count`` (``None``: all) prompts of ``prompts`` in :func:`corpus_order`, answered by ``target``
    (greedily, or sampled at ``temperature``) into the corpus under ``directory``.

    With ``answers`` (an archive of this corpus) the answers it holds are not answered again: their features are
    rebuilt under ``directory`` first (:func:`rebuild_corpus`), or with ``lazy_features`` left for whoever reads
    them to compute (:class:`dspark.train.features.OfflineFeatures` given a target computes and stores a missing one),
    so a run pays only for the samples it reads. The prompts the archive lacks are answered, their features
    captured while answering. Returns the samples (token ids and loss masks, no features), by prompt index.
    """
    directory = Path(directory)
    wanted = corpus_order(len(prompts))[:count]
    kept: set[int] = set()
    if answers is not None and lazy_features:
        stored, _ = _open_archive(target, prompts, answers, directory, max_new_tokens=max_new_tokens,
                                  temperature=temperature)
        kept = set(stored.keys) & set(wanted)
        _check_prompts(target, prompts, stored, [i for i, key in enumerate(stored.keys) if key in kept])
    elif answers is not None:
        rebuild_corpus(target, prompts, answers, directory, max_new_tokens=max_new_tokens, keys=wanted,
                       temperature=temperature, progress=progress)
        barrier()  # so that no rank answers what another is still rebuilding
    answered = [key for key in wanted if key not in kept]
    if not all(sample_path(directory, key).exists() for key in answered):
        build_corpus(target, prompts, directory, max_new_tokens=max_new_tokens, max_samples=count,
                     temperature=temperature, exclude=kept, progress=progress)
    barrier()  # every rank's share is on disk before any rank reads the corpus
    samples = load_corpus(directory, answered) if answered else []
    if kept:
        samples = sorted(samples + stored.samples(kept), key=lambda sample: sample.key)
    return samples


def grow_answers(target, prompts: list[str] | list[list[int]], count: int, archive: str | os.PathLike,
                 directory: str | os.PathLike, *, max_new_tokens: int = 192, temperature: float = 0.0,
                 progress: bool = True) -> Answers:
    """Make the answers archive at ``archive`` hold the first ``count`` prompts of ``prompts`` (in
    :func:`corpus_order`), without training on them.

    Only the prompts the archive lacks are answered, into the corpus under ``directory`` (with their features,
    which answering reads anyway); the answers it holds are kept as they are, their features left for a training
    run to rebuild. The archive is then rewritten atomically with all ``count``, its manifest recording the new
    answering runs after the old; a missing archive is started. Answering takes hours on a CPU, so one session
    can grow a pool's archive and a later one train on it (interrupted, a rerun resumes from the corpus on disk).
    The archive must have been answered with the settings given here (target dtype included: answers of two
    dtypes are two corpora), and a ``count`` that leaves out answers it holds is refused, since rewriting it
    would lose them. Returns the archive's new contents.
    """
    archive, directory = Path(archive), Path(directory)
    if not 1 <= count <= len(prompts):
        raise ValueError(f"count must be between 1 and the {len(prompts)} prompts, got {count}")
    wanted = corpus_order(len(prompts))[:count]
    held = None
    if archive.exists():
        beyond = set(load_answers(archive).keys) - set(wanted)
        if beyond:
            raise ValueError(f"{archive} holds {len(beyond)} answers beyond the first {count} prompts; ask for at "
                             "least as many prompts as it holds")
        held, _ = _open_archive(target, prompts, archive, directory, max_new_tokens=max_new_tokens,
                                temperature=temperature, same_dtype=True)
        _check_prompts(target, prompts, held, range(len(held.keys)))
    build_corpus(target, prompts, directory, max_new_tokens=max_new_tokens, max_samples=count,
                 temperature=temperature, exclude=held.keys if held is not None else (), progress=progress)
    save_answers(directory, archive, keys=wanted, base=held)
    return load_answers(archive)


def _check_prompts(target, prompts: list[str] | list[list[int]], stored: Answers, indices) -> None:
    """Refuse an archive whose prompts (at positions ``indices`` of ``stored``) the target encodes otherwise."""
    for i in indices:
        if stored.sequences[i][: stored.answer_starts[i]].tolist() != encode_prompt(target, prompts[stored.keys[i]]):
            raise ValueError(f"prompt {stored.keys[i]} encodes differently from the stored one (another tokenizer "
                             "or chat template?); answer the prompts with build_corpus instead")
