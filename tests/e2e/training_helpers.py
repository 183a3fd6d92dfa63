"""A tiny on-policy training setup shared by the training tests (and their spawned ranks)."""

import os
from pathlib import Path

import torch

from dspark.runtime.decoding import SamplingConfig, generate
from dspark.train.config import TrainConfig
from dspark.train.features import OnlineFeatures
from dspark.train.samples import Sample
from dspark.train.trainer import Trainer
from tests.e2e.conftest import drafter_for, eagle3_for, tiny_target

RECIPE_ANSWERS = Path(__file__).resolve().parents[2] / "benchmarks" / "recipes" / "smollm2_drafter.answers.npz"


def toy_recipe(**changes) -> dict:
    """train_default_drafter's arguments for a run of seconds: six of the committed ShareGPT answers (the last two
    held out), one draft layer, a 256-token draft vocabulary, no calibration; ``changes`` override them."""
    return dict(corpus_samples=6, num_draft_layers=1, draft_vocab_size=256, held_out=2, eval_every=2,
                sequences_per_step=2, num_anchors=4, answers=RECIPE_ANSWERS, calibrate=False, progress=False) | changes


def tiny_samples(target, count=8, prompt_len=8, answer_len=24, seed=0):
    gen = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, target.vocab_size, (prompt_len,), generator=gen).tolist() for _ in range(count)]
    answers = generate(target, prompts, SamplingConfig(max_new_tokens=answer_len)).tokens
    return [Sample(torch.tensor(p + a), torch.tensor([False] * len(p) + [True] * len(a)))
            for p, a in zip(prompts, answers)]


def tiny_trainer(steps=4, objective="dspark", **config):
    target = tiny_target(vocab=48)
    samples = tiny_samples(target)
    if objective == "eagle3":
        drafter = eagle3_for(target, block_size=4)
    else:
        drafter = drafter_for(target, block_size=4, enable_confidence_head=objective == "dspark",
                              markov_rank=8 if objective == "dspark" else 0,
                              confidence_head_with_markov=objective == "dspark")
    settings = dict(steps=steps, sequences_per_step=2, num_anchors=8, eval_every=0, lr=3e-3, objective=objective,
                    loss_backend="torch")
    settings.update(config)
    return Trainer(drafter, target.lm_head_weight(), OnlineFeatures(target), samples[:6], TrainConfig(**settings),
                   held_out=samples[6:]), target


def distributed_worker(rank, world, init_file, out_file, steps, objective="dspark"):
    """One rank of a gloo run; rank 0 writes the trained parameters."""
    import safetensors.torch

    torch.distributed.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    torch.set_num_threads(1)
    trainer, _ = tiny_trainer(steps=steps, objective=objective)
    trainer.fit(progress=False)
    if rank == 0:
        safetensors.torch.save_file({k: v.contiguous() for k, v in trainer.drafter.state_dict().items()}, out_file)
    # Both ranks leave together, and without gloo's teardown: a rank whose destructors close the group
    # while its peer still talks to it aborts (SIGABRT), rarely, even after a barrier.
    torch.distributed.barrier()
    os._exit(0)


def train_resuming(directory, out_file, steps):
    """Train the tiny trainer to ``steps`` with a checkpoint after every step, resuming from ``directory`` when it
    holds one; write the final weights and Adam moments to ``out_file`` (a process the tests kill and restart)."""
    import safetensors.torch

    torch.set_num_threads(1)
    trainer, target = tiny_trainer(steps=steps)
    trainer.config.checkpoint_every = 1
    if (Path(directory) / "trainer_state.json").exists():
        trainer.resume(directory, target)
    trainer.fit(output_dir=directory, progress=False)
    state = {f"weight::{k}": v.contiguous() for k, v in trainer.drafter.state_dict().items()}
    for index, moments in trainer.optimizer.state_dict()["state"].items():
        state.update({f"adam::{index}::{name}": value.contiguous() for name, value in moments.items()
                      if isinstance(value, torch.Tensor)})
    safetensors.torch.save_file(state, out_file)
