"""A training corpus answered by the target itself, with its features captured while it answers.

Drafters learn to predict what the target would say (on-policy data, paper/method.md §3), from the
target's hidden states at the same positions. Both come out of one pass: while the target answers a batch
of prompts with its KV cache, the taps and final-normed hidden state of every token it reads are kept, so
no second forward over the answers is needed.

* Answers are greedy by default. With ``temperature > 0`` they are sampled from the target's distribution at
  that temperature (Gumbel-max), each prompt from its own generator seeded by the corpus seed and the prompt's
  index, so a sample does not depend on which batch it was answered in and a resumed corpus draws what an
  uninterrupted one would (exactly in fp32; in bf16 a batch's shape changes the rounding, which can tip a
  near-tie, as it can a greedy answer's). Sampled answers give new training text for prompts whose greedy
  answer is already in a corpus; their labels are still the target's distributions at every position.

* Prompts are processed in rounds of ``round_size`` (shuffled, so an interrupted corpus is a fair sample),
  each round sorted by prompt length and cut into batches of ``batch_size``: similar lengths share a batch
  and little of the cache is padding.
* Every request stays in its batch for one step after its last token, so that token's features are read
  too; a request that has not finished when fewer than ``min_active_fraction`` of its batch are still
  running is cut there (its answer is a truncated, never a wrong, continuation of the prompt).
* Each sample is one file ``{index:06d}.safetensors`` in the layout of :class:`dspark.train.features.OfflineFeatures`
  (``hidden_states [S, taps + 1, H]`` in bf16, ``token_ids``, ``loss_mask``), written atomically; a rerun
  skips every sample already on disk, so the corpus resumes after an interruption.
* :mod:`dspark.train.answers` keeps a corpus without its features (its answers archive) and rebuilds the corpus
  from it.
* ``max_bytes`` bounds the cache on disk: regeneration stops, and says so, after the batch that reaches it;
  ``max_samples`` answers only a prefix of the shuffled order (a budget a later call can extend).
* Under ``torch.distributed`` every rank answers (or rebuilds) every world-size-th sample still to do into the one
  corpus and records its own run in ``corpus.json`` under a file lock: regeneration runs on every GPU of a job,
  each sample answered once.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import time
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

import torch

from dspark.io import atomic_write_text
from dspark.train.distributed import barrier, rank, world_size
from dspark.train.features import write_feature_file
from dspark.train.samples import Sample


@dataclass
class CorpusReport:
    """What :func:`build_corpus` did in this call: samples and answer tokens written, seconds and tokens/s."""

    samples_written: int
    answer_tokens: int
    seconds: float
    samples_total: int
    stopped_by_budget: bool

    @property
    def tokens_per_second(self) -> float:
        return self.answer_tokens / self.seconds if self.seconds > 0 else float("nan")


def sample_path(directory: Path, index: int) -> Path:
    return directory / f"{index:06d}.safetensors"


def write_sample(directory: Path, index: int, token_ids: list[int], prompt_len: int, taps: torch.Tensor,
                  hidden: torch.Tensor, dtype: torch.dtype) -> int:
    mask = torch.zeros(len(token_ids), dtype=torch.bool)
    mask[prompt_len:] = True
    path = sample_path(directory, index)
    write_feature_file(path, Sample(torch.tensor(token_ids, dtype=torch.long), mask), taps, hidden, dtype=dtype)
    return path.stat().st_size


@torch.no_grad()
def answer_batch(target, prompts: list[list[int]], *, max_new_tokens: int, min_active_fraction: float = 0.25,
                 temperature: float = 0.0, seeds: list[int] | None = None,
                 on_step=None) -> list[tuple[list[int], torch.Tensor, torch.Tensor]]:
    """Answers of one batch (greedy, or sampled at ``temperature`` with one seed per prompt in ``seeds``),
    with the features of every token read.

    Returns, per prompt, ``(answer ids, taps [P + A, taps·H], hidden [P + A, H])`` where P is the prompt's
    length and A the answer's. ``on_step(active)`` is called after every decode step with the number of
    requests fed in it (for progress bars).
    """
    from dspark.runtime.decoding import prefill

    num = len(prompts)
    if not temperature >= 0:
        raise ValueError(f"temperature must be 0 (greedy) or more, got {temperature}")
    if temperature > 0 and (seeds is None or len(seeds) != num):
        raise ValueError("sampling (temperature > 0) needs one seed per prompt")
    generators = [torch.Generator().manual_seed(s) for s in seeds] if temperature > 0 else None

    def choose(logits: torch.Tensor, requests: list[int]) -> list[int]:
        """The next token of each request in ``requests`` from its row of ``logits [len(requests), V]``."""
        if generators is None:
            return logits.argmax(-1).tolist()
        # Gumbel-max: argmax(l/T − log E), E ~ Exp(1), is a draw from softmax(l/T); one draw per answer token
        # from the request's own generator keeps it independent of its batch.
        noise = torch.stack([torch.empty(logits.shape[-1]).exponential_(generator=generators[r]) for r in requests])
        return (logits.float().cpu() / temperature - noise.log()).argmax(-1).tolist()

    eos = target.eos_token_id
    state, logits, prompt_step, _, _ = prefill(target, prompts)
    taps_of = [[prompt_step.taps[b, : len(p)].cpu()] for b, p in enumerate(prompts)]
    hidden_of = [[prompt_step.hidden[b, : len(p)].cpu()] for b, p in enumerate(prompts)]
    answers: list[list[int]] = [[int(t)] for t in choose(logits, list(range(num)))]
    finished = [(eos is not None and a[-1] == eos) or max_new_tokens <= 1 for a in answers]
    active = list(range(num))  # requests still in the batch; each is fed its last token once more after finishing
    while active:
        device = target.device
        fed = torch.tensor([answers[r][-1] for r in active], device=device)[:, None]
        step = target.forward(state, fed, state.next_pos[:, None],
                              torch.ones(len(active), 1, dtype=torch.bool, device=device))
        state.next_pos = state.next_pos + 1
        next_tokens = choose(step.logits[:, -1], active)
        step_taps, step_hidden = step.taps[:, 0].cpu(), step.hidden[:, 0].cpu()
        keep = []
        for row, r in enumerate(active):
            taps_of[r].append(step_taps[row: row + 1])
            hidden_of[r].append(step_hidden[row: row + 1])
            if finished[r]:
                continue  # its last token has now been read: it leaves the batch
            answers[r].append(int(next_tokens[row]))
            finished[r] = (eos is not None and answers[r][-1] == eos) or len(answers[r]) >= max_new_tokens
            keep.append(row)
        if on_step is not None:
            on_step(len(active))
        if len(keep) < len(active):
            rows = torch.tensor(keep, dtype=torch.long)
            if keep:
                target.select(state, rows)
            active = [active[i] for i in keep]
        if active and len(active) < min_active_fraction * num:
            for r in active:
                finished[r] = True
    return [(answers[r], torch.cat(taps_of[r]), torch.cat(hidden_of[r])) for r in range(num)]


def build_corpus(target, prompts: list[str] | list[list[int]], directory: str | os.PathLike, *,
                 max_new_tokens: int = 192,
                 batch_size: int = 64, round_size: int = 1024, max_bytes: int = 40 << 30,
                 dtype: torch.dtype = torch.bfloat16, min_active_fraction: float = 0.25, seed: int = 0,
                 temperature: float = 0.0, max_samples: int | None = None, exclude: Collection[int] = (),
                 progress: bool = True) -> CorpusReport:
    """Answer ``prompts`` with ``target`` and store samples with features under ``directory``.

    A prompt is chat text (encoded with the target's chat template) or a list of token ids (used as is).
    Answers are greedy, or with ``temperature > 0`` sampled, prompt ``i`` from a generator seeded by
    :func:`sampling_seed` of ``seed`` and ``i``.

    Prompts are answered in the order :func:`corpus_order` gives; ``max_samples`` stops after the first
    ``max_samples`` of that order (a budget, so a later call may extend the corpus with the same settings);
    ``exclude`` leaves out prompt indices answered elsewhere (an archive's, which
    :func:`dspark.train.answers.grow_answers` merges with this corpus). Resumable: samples already written are
    kept and skipped. Records its settings in ``corpus.json`` and refuses to continue a corpus made with other
    settings or another prompt list. Under ``torch.distributed`` every rank calls it: each answers its share of
    what is left (the report is its own), and rank 0 alone shows progress.
    """
    if batch_size < 1 or round_size < 1 or max_new_tokens < 1:
        raise ValueError("batch_size, round_size and max_new_tokens must be positive")
    if not temperature >= 0:
        raise ValueError(f"temperature must be 0 (greedy) or more, got {temperature}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    manifest = open_manifest(directory, corpus_settings(target, prompts, max_new_tokens, seed, dtype, temperature))
    order = corpus_order(len(prompts), seed)[:max_samples]
    excluded = set(exclude)
    barrier()  # every rank deals out the same list: none may have started writing when another lists the disk
    left = [i for i in order if i not in excluded and not sample_path(directory, i).exists()]
    todo = left[rank()::world_size()]
    used = sum(p.stat().st_size for p in directory.glob("*.safetensors"))
    report = CorpusReport(0, 0, 0.0, len(order) - len(left), False)
    bar = None
    if progress and rank() == 0:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(todo) * max_new_tokens // 2, desc="answering prompts", unit="tok", smoothing=0.05,
                   dynamic_ncols=True)
    start = time.perf_counter()

    def on_step(active: int) -> None:
        if bar is not None:
            bar.update(active)

    run_index = None  # this call's entry in the manifest's runs, written after every batch

    for r0 in range(0, len(todo), round_size):
        chunk = todo[r0: r0 + round_size]
        encoded = {i: encode_prompt(target, prompts[i]) for i in chunk}
        chunk.sort(key=lambda i: len(encoded[i]))
        for b0 in range(0, len(chunk), batch_size):
            batch = chunk[b0: b0 + batch_size]
            results = answer_batch(target, [encoded[i] for i in batch], max_new_tokens=max_new_tokens,
                                   min_active_fraction=min_active_fraction, temperature=temperature,
                                   seeds=[sampling_seed(seed, i) for i in batch], on_step=on_step)
            for i, (answer, taps, hidden) in zip(batch, results):
                used += write_sample(directory, i, encoded[i] + answer, len(encoded[i]), taps, hidden, dtype)
                report.samples_written += 1
                report.answer_tokens += len(answer)
            report.seconds = time.perf_counter() - start
            # Recorded as it goes, so a run that is interrupted (the corpus resumes) keeps its tokens and time.
            run_index = _record_run(manifest, run_index, report, batch_size)
            if bar is not None:
                # Re-estimate the remaining tokens from the answers' mean length so far.
                left = len(todo) - report.samples_written
                bar.total = bar.n + left * report.answer_tokens // max(report.samples_written, 1)
                bar.set_postfix(samples=report.samples_total + report.samples_written,
                                answer_tok_s=f"{report.tokens_per_second:.0f}", disk=f"{used / 2**30:.1f}GiB")
            if used >= max_bytes:
                report.stopped_by_budget = True
                break
        if report.stopped_by_budget:
            break
    if bar is not None:
        bar.close()
    report.samples_total += report.samples_written
    if report.samples_written:  # a call that found everything on disk adds no run
        _record_run(manifest, run_index, report, batch_size)
    if report.stopped_by_budget:
        print(f"corpus: stopped at {used / 2**30:.1f} GiB, the max_bytes budget; "
              f"{report.samples_total} of {len(prompts)} prompts answered")
    return report


def sampling_seed(seed: int, index: int) -> int:
    """The seed of prompt ``index``'s generator in a sampled corpus of seed ``seed``.

    A CPU generator keeps only the low 32 bits of its seed, so the corpus seed is mixed into those (by a Fibonacci
    hashing multiplier): corpora of two seeds draw different noise for every prompt of a pool of any real size.
    """
    return (seed * 0x9E3779B1 + index) % 2 ** 32


def corpus_settings(target, prompts: list[str] | list[list[int]], max_new_tokens: int, seed: int,
              dtype: torch.dtype, temperature: float = 0.0) -> dict:
    """What makes two corpora the same: the prompt list, the answering target, the answer budget and how
    answers are chosen (a greedy corpus records no temperature, as those written before sampling existed)."""
    settings = {"num_prompts": len(prompts), "max_new_tokens": max_new_tokens, "seed": seed,
                "target_dtype": str(next(target.model.parameters()).dtype), "feature_dtype": str(dtype),
                "tap_layers": list(target.tap_layers), "hidden_size": target.hidden_size,
                "prompts_digest": _digest(prompts)}
    if temperature > 0:
        settings["temperature"] = temperature
    return settings


@contextlib.contextmanager
def manifest_lock(directory: Path):
    """Serialise the read-modify-writes of ``corpus.json`` of processes that answer into one corpus (the ranks of
    a job): each records its own runs, and none may drop another's."""
    import fcntl

    with open(directory / ".corpus.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or when the process dies
        yield


def open_manifest(directory: Path, settings: dict, record: dict | None = None) -> Path:
    """``directory/corpus.json``, created with ``settings`` and the rest of ``record`` (an archive's manifest: its
    answering runs and rebuilds), or checked against ``settings`` if it exists."""
    manifest = directory / "corpus.json"
    with manifest_lock(directory):
        if manifest.exists():
            recorded = json.loads(manifest.read_text(encoding="utf-8"))
            if recorded.get("settings") != settings:
                raise ValueError(f"{directory} holds a corpus made with other settings ({recorded.get('settings')}); "
                                 "use another directory")
        else:
            created = {"runs": [], **(record or {}), "settings": settings}
            atomic_write_text(manifest, json.dumps(created, indent=2) + "\n")
    return manifest


def _record_run(manifest: Path, index: int | None, report: CorpusReport, batch_size: int) -> int:
    """Write this run's entry into the manifest (appended the first time, replaced after); its index."""
    entry = {"samples_written": report.samples_written, "answer_tokens": report.answer_tokens,
             "seconds": round(report.seconds, 1), "batch_size": batch_size,
             "stopped_by_budget": report.stopped_by_budget}
    with manifest_lock(manifest.parent):
        recorded = json.loads(manifest.read_text(encoding="utf-8"))
        if index is None:
            recorded["runs"].append(entry)
            index = len(recorded["runs"]) - 1
        else:
            recorded["runs"][index] = entry
        atomic_write_text(manifest, json.dumps(recorded, indent=2) + "\n")
    return index


def corpus_order(num_prompts: int, seed: int = 0) -> list[int]:
    """The order in which :func:`build_corpus` answers prompts: a seeded shuffle, so any prefix of it is a fair
    sample of the prompt list."""
    order = list(range(num_prompts))
    random.Random(seed).shuffle(order)
    return order


def load_corpus(directory: str | os.PathLike, keys: list[int] | None = None) -> list[Sample]:
    """The samples stored under ``directory`` (token ids and loss masks only; features stay on disk), by index.

    ``keys`` selects prompt indices (e.g. a prefix of :func:`corpus_order`); a selected sample that is missing
    is an error. Each sample's ``key`` is its prompt index, which names its feature file for
    :class:`dspark.train.features.OfflineFeatures`.
    """
    from safetensors import safe_open

    directory = Path(directory)
    if keys is None:
        paths = sorted(directory.glob("[0-9]*.safetensors"))
    else:
        paths = [sample_path(directory, k) for k in sorted(keys)]
        missing = [p.name for p in paths if not p.exists()]
        if missing:
            raise ValueError(f"{directory} lacks {len(missing)} selected samples (first: {missing[0]}): "
                             "build the corpus first")
    samples = []
    for path in paths:
        with safe_open(path, framework="pt") as f:
            samples.append(Sample(f.get_tensor("token_ids"), f.get_tensor("loss_mask").bool(), key=int(path.stem)))
    return samples


def encode_prompt(target, prompt: str | list[int]) -> list[int]:
    if isinstance(prompt, str):
        return target.encode_chat(prompt)
    if not prompt or not all(isinstance(t, int) and 0 <= t < target.vocab_size for t in prompt):
        raise ValueError(f"a token-id prompt must be a non-empty list of ints in [0, {target.vocab_size})")
    return list(prompt)


def _digest(prompts: list[str] | list[list[int]]) -> str:
    import hashlib

    h = hashlib.sha256()
    for p in prompts:
        h.update(p.encode("utf-8") if isinstance(p, str) else repr(list(p)).encode("ascii"))
        h.update(b"\0")
    return h.hexdigest()[:16]
