"""One rank of a ``torchrun`` training job that may lose a rank (gloo, CPU), for the fault tests.

    torchrun --standalone --nproc_per_node 2 [--max-restarts 1] tests/e2e/torchrun_rank_kill.py \
        ENGINE RUN_DIR [KILL_MARKER]

Trains the tiny setup of :func:`tests.e2e.training_helpers.tiny_trainer` under ``ENGINE`` (``ddp`` or ``fsdp``)
for 4 steps, checkpointing into ``RUN_DIR`` after every step and resuming from it when it holds a checkpoint.
With ``KILL_MARKER``, rank 1 SIGKILLs itself as it starts step 3, unless the marker file exists (it creates it
first, so a restarted job runs through). The last checkpoint in ``RUN_DIR`` holds the final weights and Adam
moments.
"""

import os
import signal
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from dspark.train.distributed import init_from_torchrun  # noqa: E402
from tests.e2e.training_helpers import tiny_trainer  # noqa: E402

STEPS = 4
KILLED_AT = 2  # steps done when rank 1 dies: the step-2 checkpoint is the last whole one


def main() -> None:
    engine, run_dir = sys.argv[1], Path(sys.argv[2])
    marker = Path(sys.argv[3]) if len(sys.argv) > 3 else None
    init_from_torchrun("gloo")
    torch.set_num_threads(1)
    trainer, target = tiny_trainer(steps=STEPS, parallel=engine, checkpoint_every=1)
    if (run_dir / "trainer_state.json").exists():
        trainer.resume(run_dir, target)
    step = trainer.train_step

    def train_step():
        if marker is not None and trainer.step == KILLED_AT and torch.distributed.get_rank() == 1 \
                and not marker.exists():
            marker.touch()
            os.kill(os.getpid(), signal.SIGKILL)
        return step()

    trainer.train_step = train_step
    trainer.fit(output_dir=run_dir, progress=True)
    torch.distributed.barrier()
    # Leave without gloo's teardown: a rank whose destructors close the group while its peer still talks to
    # it aborts (SIGABRT), rarely, even after a barrier.
    os._exit(0)


if __name__ == "__main__":
    main()
