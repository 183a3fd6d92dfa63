"""Captured CUDA graphs of the draft side and the verifier replay the eager static path bit for bit.

Skipped without CUDA: the CPU tests (``tests/e2e/test_graphs.py``) check that the captured functions hold still
(same shapes every round, no device reads, no host copies); this checks the capture itself, on a random-weight
target of SmolLM2-135M's shapes and a drafter of the shipped drafter's shapes, in bf16.
"""

from __future__ import annotations

import pytest
import torch

from benchmarks.bench_round import build
from dspark.runtime.decoding import SamplingConfig, SpeculativeDecoder
from dspark.scheduler import Threshold

pytestmark = pytest.mark.gpu


def _rounds(target, drafter, config, graphs: str, max_batch):
    """Decode three prompts, keeping a copy of every round's draft and verdict."""
    decoder = SpeculativeDecoder(target, drafter, config, scheduler=Threshold(0.3), backend="triton", graphs=graphs)
    prompts = torch.randint(target.vocab_size - 1, (3, 24), generator=torch.Generator().manual_seed(0)).tolist()
    decoder.start(prompts, max_batch)
    seen = []
    draft, verify = decoder.static.draft, decoder.static.verify

    def keep(result):  # copied at once: a captured graph's outputs are overwritten by its next replay
        seen.append(_copies(result))
        return result

    decoder.static.draft = lambda *args: keep(draft(*args))
    decoder.static.verify = lambda *args: keep(verify(*args))
    result = decoder.run()
    return decoder, result, seen


def _copies(outputs) -> list[torch.Tensor]:
    """Copies of every tensor in a draft, a verdict, or a tuple of them."""
    if isinstance(outputs, tuple):
        return [t for part in outputs for t in _copies(part)]
    if isinstance(outputs, torch.Tensor):
        return [outputs.clone()]
    return [value.clone() for value in vars(outputs).values() if value is not None]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("max_batch", [None, 2])
def test_captured_rounds_equal_eager_rounds_bit_for_bit(temperature, max_batch):
    target, drafter = build("cuda", torch.bfloat16, 16384)
    config = SamplingConfig(max_new_tokens=24, temperature=temperature, eos_token_id=target.vocab_size - 1)
    eager, eager_result, eager_rounds = _rounds(target, drafter, config, "eager", max_batch)
    captured, captured_result, captured_rounds = _rounds(target, drafter, config, "captured", max_batch)
    assert eager.graph_mode == "eager" and captured.graph_mode == "captured"
    assert captured.static.captures >= 2 and eager.static.captures == 0
    assert captured_result.tokens == eager_result.tokens
    assert len(captured_rounds) == len(eager_rounds)
    for index, (ours, theirs) in enumerate(zip(captured_rounds, eager_rounds)):
        for a, b in zip(ours, theirs, strict=True):
            assert torch.equal(a, b), f"call {index} differs between captured and eager"
