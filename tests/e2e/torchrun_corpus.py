"""One rank of a ``torchrun`` job in which every rank answers (or rebuilds) its share of one corpus (gloo, CPU).

    torchrun --standalone --nproc_per_node 2 tests/e2e/torchrun_corpus.py CORPUS_DIR [ANSWERS_ARCHIVE]

Every rank then reads the whole corpus back and checks that it holds every prompt's sample.
"""

import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from dspark.train.answers import answered_corpus  # noqa: E402
from dspark.train.distributed import init_from_torchrun  # noqa: E402
from tests.e2e.conftest import tiny_target  # noqa: E402

MAX_NEW_TOKENS = 6


def corpus_prompts() -> list[list[int]]:
    """Ten prompts of 3 to 7 token ids."""
    return [[1 + (7 * i + j) % 40 for j in range(3 + i % 5)] for i in range(10)]


def main() -> None:
    directory = Path(sys.argv[1])
    answers = Path(sys.argv[2]) if len(sys.argv) > 2 else None
    init_from_torchrun("gloo")
    torch.set_num_threads(1)
    samples = answered_corpus(tiny_target(vocab=48), corpus_prompts(), directory, answers=answers,
                              max_new_tokens=MAX_NEW_TOKENS, progress=False)
    assert sorted(s.key for s in samples) == list(range(len(corpus_prompts())))
    torch.distributed.barrier()
    # Leave without gloo's teardown: a rank whose destructors close the group while its peer still talks to
    # it aborts (SIGABRT), rarely, even after a barrier.
    os._exit(0)


if __name__ == "__main__":
    main()
