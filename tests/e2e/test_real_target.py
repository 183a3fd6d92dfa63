"""The default target, SmolLM2-135M-Instruct, on real prompts: speculative output equals the target's."""

import pytest
import torch

from dspark.data import load_prompt_mix
from dspark.decoding import SamplingConfig, generate, speculative_generate
from dspark.sampling import warp_logits
from dspark.scheduler import FixedLength, PrefixScheduler, ProductionScheduler, SPSTable, Threshold
from dspark.testing import chi_square_pvalue
from tests.e2e.conftest import ScriptedDrafter, drafter_for

NEW_TOKENS = 8


def policies():
    sps = SPSTable.linear(0.05, 0.002, 256)  # a CPU-like curve: cost grows with every token
    return [FixedLength(7), FixedLength(3), Threshold(0.5), PrefixScheduler(sps), ProductionScheduler(sps)]


@pytest.fixture(scope="module")
def prompts(real_target):
    """The 20 shortest of 60 real prompts (20 math, 20 code, 20 chat), to keep CPU time down."""
    encoded = [real_target.encode_chat(p.text) for p in load_prompt_mix(20)]
    return sorted(encoded, key=len)[:20]


@pytest.fixture(scope="module")
def greedy_reference(real_target, prompts):
    config = SamplingConfig(max_new_tokens=NEW_TOKENS)
    return generate(real_target, prompts, config).tokens


@pytest.mark.parametrize("batch", [1, 4])
def test_greedy_speculative_equals_target_on_20_prompts(real_target, prompts, greedy_reference, batch):
    config = SamplingConfig(max_new_tokens=NEW_TOKENS)
    untrained = drafter_for(real_target, block_size=7, num_draft_layers=1, markov_rank=32)
    scripted = ScriptedDrafter(untrained.config, greedy_reference)
    # Every policy with the scripted drafter (accepts and rejects); the untrained one rarely gets a draft
    # accepted, so one policy checks its plumbing.
    runs = [(scripted, policy) for policy in policies()] + [(untrained, policies()[3])]
    for drafter, policy in runs:
        out, accepted = [], 0
        for i in range(0, len(prompts), batch):
            if isinstance(drafter, ScriptedDrafter):
                drafter.continuations = greedy_reference[i: i + batch]
            result = speculative_generate(real_target, drafter, prompts[i: i + batch], config, scheduler=policy)
            out += result.tokens
            accepted += result.stats.accepted
        assert out == greedy_reference, f"{type(drafter).__name__}, {policy.name}, batch {batch}"
        if isinstance(drafter, ScriptedDrafter):
            assert accepted > 0, f"{policy.name}: the scripted drafter must get drafts accepted"


def test_sampled_first_tokens_follow_the_target(real_target):
    """600 streams of one short prompt, T = 0.8, top-k 4: joint of the first two tokens (the second through
    draft and verification) against the target's exact p(t1) p(t2 | t1), chi-square at alpha = 1e-3."""
    prompt = real_target.tokenizer.encode("The capital of France is")
    samples, top_k, temperature = 600, 4, 0.8
    config = SamplingConfig(max_new_tokens=3, temperature=temperature, top_k=top_k, seed=5)
    drafter = drafter_for(real_target, block_size=3, num_draft_layers=1, markov_rank=16)
    result = speculative_generate(real_target, drafter, [prompt] * samples, config)
    with torch.no_grad():
        first = warp_logits(real_target.model(input_ids=torch.tensor([prompt])).logits[0, -1], temperature, top_k)
        support = first.nonzero().squeeze(1).tolist()
        second = {t: warp_logits(real_target.model(input_ids=torch.tensor([prompt + [t]])).logits[0, -1],
                                 temperature, top_k) for t in support}
    cells = [(a, b) for a in support for b in second[a].nonzero().squeeze(1).tolist()]
    index = {cell: i for i, cell in enumerate(cells)}
    counts = torch.zeros(len(cells))
    for tokens in result.tokens:
        counts[index[(tokens[0], tokens[1])]] += 1  # a pair outside the support would raise KeyError
    expected = torch.tensor([float(first[a] * second[a][b]) for a, b in cells])
    p = chi_square_pvalue(counts, expected)
    assert p > 1e-3, f"sampled speculative output differs from the target (chi-square p = {p:.2e})"
