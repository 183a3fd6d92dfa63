"""Sliding-window and hybrid (local/global) targets: a batched, speculative, rolled-back decode equals each
prompt decoded alone by full forward passes."""

import pytest
import torch

from dspark.runtime.decoding import SamplingConfig, generate, speculative_generate
from dspark.scheduler import FixedLength, PrefixScheduler, SPSTable
from tests.e2e.conftest import SLIDING_WINDOW, drafter_for, tiny_target

# Ragged prompts, the longest past two windows; 30 new tokens cross the window again in every request.
PROMPTS = [[1, 2, 3], list(range(4, 44)), [5, 9, 2, 7, 7, 1, 30, 12], list(range(50, 14, -1)), [33]]
NEW_TOKENS = 30


def alone(target, prompt: list[int], new_tokens: int) -> list[int]:
    """Greedy decode of one prompt by a full forward pass per token: no cache, no padding, no rollback."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(new_tokens):
            logits = target.model(input_ids=torch.tensor([ids])).logits[0, -1]
            ids.append(int(logits.argmax()))
    return ids[len(prompt):]


@pytest.mark.parametrize("architecture", ["mistral", "gemma3", "llama", "qwen3"])
def test_batched_and_speculative_decodes_equal_each_prompt_alone(architecture):
    target = tiny_target(architecture)
    assert max(map(len, PROMPTS)) + NEW_TOKENS > 3 * SLIDING_WINDOW
    want = [alone(target, p, NEW_TOKENS) for p in PROMPTS]
    config = SamplingConfig(max_new_tokens=NEW_TOKENS, temperature=0.0)
    assert generate(target, PROMPTS, config).tokens == want, "batched generate"
    drafter = drafter_for(target)
    for policy in (FixedLength(3), PrefixScheduler(SPSTable.linear(1.0, 0.05, 64))):
        assert speculative_generate(target, drafter, PROMPTS, config, scheduler=policy).tokens == want, \
            f"batched speculative, {policy.name}"
    single = [speculative_generate(target, drafter, [p], config, scheduler=FixedLength(3)).tokens[0] for p in PROMPTS]
    assert single == want, "speculative at batch 1"
    # Continuous batching pads the joining request's slots or the running ones' to a common count.
    assert generate(target, PROMPTS, config, max_batch=2).tokens == want, "continuous generate"
    continuous = speculative_generate(target, drafter, PROMPTS, config, scheduler=FixedLength(3), max_batch=2)
    assert continuous.tokens == want, "continuous speculative"
