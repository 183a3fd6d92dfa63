"""One rank of a ``torchrun`` training job for the data-parallel tests (gloo, CPU).

    torchrun --standalone --nproc_per_node 2 tests/e2e/torchrun_training.py ENGINE OUT_DIR

Trains the tiny setup of :func:`tests.e2e.training_helpers.tiny_trainer` twice under ``ENGINE`` (``ddp`` or
``fsdp``): straight through 4 steps, evaluating every 2, and 2 steps then a checkpoint and a fresh trainer
resumed from it for the other 2. Rank 0 writes both runs' final checkpoints under ``OUT_DIR``
(``straight/``, ``resumed/``), and the error a batch that does not split over the ranks raises
(``uneven_batch_error.txt``).
"""

import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from dspark.train.distributed import init_from_torchrun  # noqa: E402
from tests.e2e.training_helpers import tiny_trainer  # noqa: E402

STEPS = 4


def main() -> None:
    engine, out = sys.argv[1], Path(sys.argv[2])
    init_from_torchrun("gloo")
    torch.set_num_threads(1)
    try:
        tiny_trainer(steps=STEPS, parallel=engine, sequences_per_step=3)
    except ValueError as error:  # 3 sequences cannot split evenly over 2 ranks
        if torch.distributed.get_rank() == 0:
            out.mkdir(parents=True, exist_ok=True)
            (out / "uneven_batch_error.txt").write_text(str(error), encoding="utf-8")
    straight, _ = tiny_trainer(steps=STEPS, parallel=engine, eval_every=2)
    straight.fit(progress=False)
    straight.save(out / "straight")

    first, _ = tiny_trainer(steps=STEPS, parallel=engine)
    while first.step < STEPS // 2:
        first.train_step()
    first.save(out / "halfway")
    resumed, _ = tiny_trainer(steps=STEPS, parallel=engine)
    resumed.resume(out / "halfway")
    resumed.fit(progress=False)
    resumed.save(out / "resumed")
    torch.distributed.barrier()
    # Leave without gloo's teardown: a rank whose destructors close the group while its peer still talks to
    # it aborts (SIGABRT), rarely, even after a barrier.
    os._exit(0)


if __name__ == "__main__":
    main()
