"""What goes wrong around a run: truncated and corrupt files, a config that does not fit its weights, a model
directory without a tokenizer, two processes converting one target or answering into one feature cache, a writer
killed between two renames."""

import json
import multiprocessing
import os
import time
from pathlib import Path

import pytest
import torch

from dspark.files.checkpoint import load_drafter, save_drafter
from dspark.io import atomic_directory
from dspark.runtime.target import convert_once, load_target
from tests.e2e.conftest import drafter_for, save_tiny_target, tiny_target


@pytest.fixture
def saved(tmp_path):
    target = tiny_target()
    return target, save_drafter(drafter_for(target), tmp_path / "drafter")


def test_a_truncated_weights_file_names_the_file(saved):
    target, directory = saved
    weights = directory / "model.safetensors"
    data = weights.read_bytes()
    config = json.loads((directory / "config.json").read_text())
    weights.write_bytes(data[: len(data) // 2])
    config.pop("sha256")  # as a checkpoint older than the digest: the reader must still refuse the torn file
    (directory / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="model.safetensors is not a readable safetensors file.*truncated"):
        load_drafter(directory, target)


def test_a_flipped_bit_is_caught_by_the_recorded_digest(saved):
    target, directory = saved
    weights = directory / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-5] ^= 0x10  # inside the last tensor's data: the file still parses, one weight changed
    weights.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="does not match the sha256"):
        load_drafter(directory, target)


def test_a_config_that_does_not_fit_the_weights_names_both_files(saved):
    target, directory = saved
    config = json.loads((directory / "config.json").read_text())
    config["dspark_config"]["markov_rank"] = 4  # the weights hold a rank-8 Markov head
    (directory / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"model.safetensors does not fit .*config.json"):
        load_drafter(directory, target)


def test_a_model_directory_without_its_tokenizer_or_weights_says_which(tmp_path):
    model = save_tiny_target(tmp_path / "model")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (model / name).unlink()
    with pytest.raises(ValueError, match="model: cannot load its tokenizer"):
        load_target(model)
    whole = save_tiny_target(tmp_path / "whole")
    weights = whole / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(ValueError, match="whole: cannot load its config and weights"):
        load_target(whole)


def _convert_slowly(directory: str, log: str) -> None:
    """A stand-in for dequantising a GGUF file: slow enough for the other process to arrive while it runs."""
    def convert():
        with open(log, "a") as f:
            f.write(f"{os.getpid()}\n")
        with atomic_directory(directory) as tmp:
            time.sleep(1.0)
            (tmp / "model.safetensors").write_bytes(b"x" * 1000)

    convert_once(Path(directory), convert)


def test_two_processes_converting_one_target_convert_once(tmp_path):
    directory, log = tmp_path / "converted", tmp_path / "log"
    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=_convert_slowly, args=(str(directory), str(log))) for _ in range(2)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
    assert [worker.exitcode for worker in workers] == [0, 0]
    assert len(log.read_text().split()) == 1, "converted twice"
    assert (directory / "model.safetensors").read_bytes() == b"x" * 1000


def _answer_into(directory):
    """One of two processes answering the same prompts into the same feature cache at once."""
    from dspark.train.corpus import build_corpus
    from tests.e2e.torchrun_corpus import MAX_NEW_TOKENS, corpus_prompts

    torch.set_num_threads(1)
    build_corpus(tiny_target(vocab=48), corpus_prompts(), directory, max_new_tokens=MAX_NEW_TOKENS, batch_size=2,
                 progress=False)


def test_two_processes_answering_into_one_feature_cache_both_finish_and_leave_it_whole(tmp_path):
    """Each sample is written by an atomic rename and each run's record under a file lock: whichever process
    writes a sample last, the cache holds every sample whole, equal to one process's, and both runs' records."""
    from dspark.train.corpus import build_corpus, load_corpus
    from tests.e2e.torchrun_corpus import MAX_NEW_TOKENS, corpus_prompts

    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=_answer_into, args=(str(tmp_path / "shared"),)) for _ in range(2)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(300)
    assert [worker.exitcode for worker in workers] == [0, 0]
    build_corpus(tiny_target(vocab=48), corpus_prompts(), tmp_path / "alone", max_new_tokens=MAX_NEW_TOKENS,
                 progress=False)
    assert [(s.key, s.token_ids.tolist(), s.loss_mask.tolist()) for s in load_corpus(tmp_path / "shared")] == \
        [(s.key, s.token_ids.tolist(), s.loss_mask.tolist()) for s in load_corpus(tmp_path / "alone")]
    runs = json.loads((tmp_path / "shared" / "corpus.json").read_text(encoding="utf-8"))["runs"]
    # A process that found every sample on disk records no run; one that raced the other records its own.
    assert 1 <= len(runs) <= 2 and sum(run["samples_written"] for run in runs) >= len(corpus_prompts())
    assert not list((tmp_path / "shared").glob(".*.tmp*")), "a temporary file was left behind"


def test_a_writer_killed_between_the_two_renames_loses_nothing(saved):
    """atomic_directory moves the old folder aside, then the new one in. A process killed in between leaves only
    the old one, aside: the next reader or writer puts it back."""
    target, directory = saved
    before = load_drafter(directory, target).state_dict()
    os.replace(directory, directory.with_name(f".{directory.name}.old"))  # where the kill leaves it
    after = load_drafter(directory, target).state_dict()
    assert all(torch.equal(before[name], after[name]) for name in before)
    os.replace(directory, directory.with_name(f".{directory.name}.old"))
    save_drafter(drafter_for(target, seed=1), directory)  # a writer finds it too, and replaces it whole
    assert not directory.with_name(f".{directory.name}.old").exists()


def _resuming(directory: str, out_file: str, steps: int) -> None:
    from tests.e2e.training_helpers import train_resuming

    train_resuming(directory, out_file, steps)


def _checkpointed_step(directory) -> int:
    try:
        return json.loads((directory / "trainer_state.json").read_text())["step"]
    except (OSError, ValueError, KeyError):  # none yet, or caught between two renames
        return 0


def test_a_run_killed_at_random_moments_ends_as_one_never_killed(tmp_path):
    """SIGKILL the training process at a random moment after each new checkpoint (one every step, so kills land in
    steps and in checkpoint writes alike) and start it again: the run that finishes holds the weights and Adam
    moments of a run never killed, bit for bit."""
    import random

    import safetensors.torch

    steps, context, rng = 24, multiprocessing.get_context("spawn"), random.Random(0)

    def start(name: str):
        worker = context.Process(target=_resuming, args=(str(tmp_path / name), str(tmp_path / f"{name}.st"), steps))
        worker.start()
        return worker

    straight = start("straight")
    straight.join(300)
    assert straight.exitcode == 0
    kills, directory = 0, tmp_path / "killed"
    while not (tmp_path / "killed.st").exists():
        before, worker = _checkpointed_step(directory), start("killed")
        deadline = time.monotonic() + 300
        while worker.is_alive() and _checkpointed_step(directory) <= before and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(rng.uniform(0.0, 0.1))  # somewhere in the next step or its checkpoint write
        if worker.is_alive():
            worker.kill()  # SIGKILL
            kills += 1
        worker.join()
        assert worker.exitcode in (0, -9), f"the training process failed (exit {worker.exitcode})"
    assert kills >= 3, f"only {kills} kills landed: the test tested little"
    want = safetensors.torch.load_file(tmp_path / "straight.st")
    got = safetensors.torch.load_file(tmp_path / "killed.st")
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)
