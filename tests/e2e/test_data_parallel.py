"""One batched step, and data parallelism on torch's engines (DDP and FSDP2 under torchrun, gloo on CPU)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import safetensors.torch
import torch

from benchmarks.bench_training import OpCounter
from dspark.train.samples import Sample
from tests.e2e.training_helpers import tiny_trainer

ROOT = Path(__file__).resolve().parents[2]


def ragged(trainer, lengths):
    """The trainer's samples cut to ``lengths`` (so that a step pads its contexts), answers kept non-empty."""
    trainer.train = [Sample(s.token_ids[:n], s.loss_mask[:n]) for s, n in zip(trainer.train, lengths)]
    return trainer


@pytest.mark.parametrize("objective", ["dspark", "dflash"])
def test_one_batched_backward_equals_the_sum_of_per_sequence_backwards(objective):
    """A step stacks ragged sequences into one padded batch: its gradient must be the per-sequence losses'
    summed gradient (what steps computed before the batched step), so earlier runs stay comparable."""
    trainer, _ = tiny_trainer(objective=objective, sequences_per_step=4, precision="fp32")
    ragged(trainer, [32, 19, 27, 12])
    items = [(i, trainer.train[i]) for i in range(4)]
    blocks = [trainer._blocks(0, [item]) for item in items]
    normalizer = sum(b.weights.double().sum() for b in blocks)
    params = [p for p in trainer.drafter.parameters() if p.requires_grad]
    for b in blocks:
        trainer.module(b, normalizer).loss.backward()
    per_sequence = [p.grad.clone() for p in params]
    trainer.optimizer.zero_grad()
    trainer.module(trainer._blocks(0, items), normalizer).loss.backward()
    for (name, p), expected in zip([(n, p) for n, p in trainer.drafter.named_parameters() if p.requires_grad],
                                   per_sequence):
        # fp32, the same terms summed in another order (one GEMM over all rows instead of four): rounding only.
        torch.testing.assert_close(p.grad, expected, rtol=1e-5, atol=1e-7, msg=name)


class Precomputed:
    """A source's features computed once up front, as offline features are: the count is of the step alone."""

    def __init__(self, source, samples):
        self.rows = [source.features(i, s) for i, s in enumerate(samples)]

    def features(self, index, sample):
        return self.rows[index]


def ops_per_step(sequences: int) -> int:
    trainer, _ = tiny_trainer(steps=3, sequences_per_step=sequences)
    trainer.train = trainer.train * 3  # enough sequences that a step never repeats one
    trainer.source = Precomputed(trainer.source, trainer.train)
    trainer.train_step()  # the first step also allocates the optimiser state
    with OpCounter() as counter:
        trainer.train_step()
    return counter.ops


def test_a_steps_op_count_does_not_grow_with_its_sequences():
    one, sixteen = ops_per_step(1), ops_per_step(16)
    # Per sequence only its anchors are drawn and its rows copied into the batch (a few ops each).
    assert sixteen <= 1.5 * one, (one, sixteen)


def test_data_parallel_engines_need_a_process_group_and_a_known_name(monkeypatch):
    from dspark.train.distributed import init_from_torchrun

    monkeypatch.delenv("MASTER_PORT", raising=False)
    with pytest.raises(ValueError, match="not launched by torchrun: .*MASTER_PORT"):
        init_from_torchrun()
    with pytest.raises(ValueError, match="torchrun"):
        tiny_trainer(parallel="fsdp")
    with pytest.raises(ValueError, match="parallel must be one of"):
        tiny_trainer(parallel="zero3")
    with pytest.raises(ValueError, match="compile must be False, True or 'reduce-overhead'"):
        tiny_trainer(compile="max-autotune")


@pytest.mark.parametrize("engine", ["ddp", "fsdp"])
def test_torchrun_two_processes_train_as_one_and_resume_bit_for_bit(tmp_path, engine):
    single, _ = tiny_trainer(steps=4, eval_every=2)
    single.fit(progress=False)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           str(ROOT / "tests" / "e2e" / "torchrun_training.py"), engine, str(tmp_path)],
                          capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "multiple of the world size" in (tmp_path / "uneven_batch_error.txt").read_text(encoding="utf-8")
    straight = safetensors.torch.load_file(tmp_path / "straight" / "model.safetensors")
    resumed = safetensors.torch.load_file(tmp_path / "resumed" / "model.safetensors")
    expected = single.drafter.state_dict()
    assert straight.keys() and set(straight) <= set(expected)
    for name, value in straight.items():
        # Each rank sums its half of the rows and the engine averages: fp32 rounding only.
        torch.testing.assert_close(value, expected[name], rtol=1e-5, atol=1e-6, msg=name)
        assert torch.equal(resumed[name], value), name
    # Evaluation runs through the wrapped module on every rank (FSDP2 gathers the weights for it).
    history = json.loads((tmp_path / "straight" / "trainer_state.json").read_text(encoding="utf-8"))["history"]
    evaluated = [row["eval_tau_prob"] for row in history if "eval_tau_prob" in row]
    assert evaluated == pytest.approx([row["eval_tau_prob"] for row in single.history if "eval_tau_prob" in row],
                                      rel=1e-5)
    moments = safetensors.torch.load_file(tmp_path / "straight" / "optimizer.safetensors")
    resumed_moments = safetensors.torch.load_file(tmp_path / "resumed" / "optimizer.safetensors")
    assert moments.keys() == resumed_moments.keys() and any(k.endswith("::exp_avg") for k in moments)
    assert all(torch.equal(moments[k], resumed_moments[k]) for k in moments)


@pytest.mark.parametrize("mode", [True, "reduce-overhead"])
def test_a_compiled_step_trains_as_the_eager_one(mode):
    """torch.compile (inductor, on the CPU here) against the eager step it replaces, from the same weights. On a
    CPU "reduce-overhead" captures no CUDA graph: this checks that the option reaches the compiler and trains."""
    eager, _ = tiny_trainer(steps=3, precision="fp32")
    compiled, _ = tiny_trainer(steps=3, precision="fp32", compile=mode)
    compiled.drafter.load_state_dict(eager.drafter.state_dict())
    eager_rows = [eager.train_step() for _ in range(3)]
    compiled_rows = [compiled.train_step() for _ in range(3)]
    for e, c in zip(eager_rows, compiled_rows):
        # Fused kernels sum in another order, and padding to 64 rows adds context rows no block sees.
        assert c["loss"] == pytest.approx(e["loss"], rel=1e-4)
    for (name, e), c in zip(eager.drafter.state_dict().items(), compiled.drafter.state_dict().values()):
        torch.testing.assert_close(c, e, rtol=1e-4, atol=1e-5, msg=name)


def torchrun(engine, run_dir, *extra, restarts=None):
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    if restarts is not None:
        launcher += ["--max-restarts", str(restarts)]
    return subprocess.run([*launcher, str(ROOT / "tests" / "e2e" / "torchrun_rank_kill.py"), engine, str(run_dir),
                           *map(str, extra)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=600)


def checkpoint_tensors(run_dir):
    return {f"{name}::{key}": value for name in ("model", "optimizer")
            for key, value in safetensors.torch.load_file(run_dir / f"{name}.safetensors").items()}


@pytest.mark.parametrize("engine", ["ddp", "fsdp"])
def test_a_killed_rank_restarts_from_the_last_checkpoint_or_stops_with_it_whole(tmp_path, engine):
    """SIGKILL rank 1 as it starts step 3 of 4. With ``--max-restarts 1`` torchrun restarts both ranks, which
    resume from the step-2 checkpoint and end bit for bit where an uninterrupted job ends; without it the job
    stops, naming the rank and the signal, and its run directory holds the step-2 checkpoint, whole."""
    whole = torchrun(engine, tmp_path / "uninterrupted")
    assert whole.returncode == 0, whole.stderr[-3000:]
    expected = checkpoint_tensors(tmp_path / "uninterrupted")

    restarted = torchrun(engine, tmp_path / "restarted", tmp_path / "killed-once", restarts=1)
    assert restarted.returncode == 0, restarted.stderr[-3000:]
    assert (tmp_path / "killed-once").exists(), "rank 1 was never killed"
    assert "at step 2 of 4" in restarted.stdout + restarted.stderr
    got = checkpoint_tensors(tmp_path / "restarted")
    assert got.keys() == expected.keys() and any(k.endswith("::exp_avg") for k in got)
    assert [k for k in got if not torch.equal(got[k], expected[k])] == []

    stopped = torchrun(engine, tmp_path / "stopped", tmp_path / "killed")
    assert stopped.returncode != 0
    assert "SIGKILL" in stopped.stderr and "rank" in stopped.stderr, stopped.stderr[-3000:]
    state = json.loads((tmp_path / "stopped" / "trainer_state.json").read_text(encoding="utf-8"))
    assert state["step"] == 2
    assert checkpoint_tensors(tmp_path / "stopped").keys() == expected.keys()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary folder left


def test_ranks_answer_and_rebuild_one_corpus_each_sample_once(tmp_path):
    """Two ranks answering one corpus each answer half of it, and the corpus is the one a single process
    answers, token for token; rebuilding it from its archive is shared the same way."""
    from dspark.train.answers import answered_corpus, save_answers
    from dspark.train.corpus import load_corpus
    from tests.e2e.conftest import tiny_target
    from tests.e2e.torchrun_corpus import MAX_NEW_TOKENS, corpus_prompts

    alone = answered_corpus(tiny_target(vocab=48), corpus_prompts(), tmp_path / "alone",
                            max_new_tokens=MAX_NEW_TOKENS, progress=False)
    archive = save_answers(tmp_path / "alone", tmp_path / "alone.answers.npz")
    script = ROOT / "tests" / "e2e" / "torchrun_corpus.py"
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(script)]
    for directory, extra in (("answered", []), ("rebuilt", [str(archive)])):
        done = subprocess.run([*launcher, str(tmp_path / directory), *extra], capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        shared = load_corpus(tmp_path / directory)
        assert [(s.key, s.token_ids.tolist(), s.loss_mask.tolist()) for s in shared] == \
            [(s.key, s.token_ids.tolist(), s.loss_mask.tolist()) for s in alone], directory
    manifest = json.loads((tmp_path / "answered" / "corpus.json").read_text(encoding="utf-8"))
    assert sorted(run["samples_written"] for run in manifest["runs"]) == [5, 5]  # one run a rank, half each
    manifest = json.loads((tmp_path / "rebuilt" / "corpus.json").read_text(encoding="utf-8"))
    assert sorted(rebuild["samples_written"] for rebuild in manifest["rebuilds"]) == [5, 5]
