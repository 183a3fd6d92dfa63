import math

import pytest
import torch
from dspark.reference.metrics import acceptance_metrics
from hypothesis import given
from hypothesis import strategies as st

from dspark.metrics import AcceptanceStats


@given(rounds=st.integers(1, 30), gamma=st.integers(1, 6), seed=st.integers(0, 2**31), split=st.integers(0, 30))
def test_metrics_match_reference(rounds, gamma, seed, split):
    gen = torch.Generator().manual_seed(seed)
    verify_len = torch.randint(0, gamma + 1, (rounds,), generator=gen)
    accepted = (torch.rand(rounds, generator=gen) * (verify_len + 1)).long()
    eos_round = torch.rand(rounds, generator=gen) < 0.1
    committed = accepted + (~eos_round).long()
    split = min(split, rounds)
    stats = AcceptanceStats(gamma)
    stats.update(verify_len[:split], accepted[:split], committed[:split])
    other = AcceptanceStats(gamma)
    other.update(verify_len[split:], accepted[split:], committed[split:])
    got = stats.merge(other).as_dict()
    want = acceptance_metrics(list(zip(verify_len.tolist(), accepted.tolist(), committed.tolist())), gamma)
    for key, value in want.items():
        if isinstance(value, list):
            assert [x if not math.isnan(x) else None for x in got[key]] == pytest.approx(
                [x if not math.isnan(x) else None for x in value])
        else:
            assert got[key] == pytest.approx(value)


def test_conditional_and_unconditional_by_hand():
    stats = AcceptanceStats(3)
    # verify 3 accept 3; verify 3 accept 1; verify 2 accept 0; verify 0.
    stats.update(torch.tensor([3, 3, 2, 0]), torch.tensor([3, 1, 0, 0]), torch.tensor([4, 2, 1, 1]))
    assert stats.tau == pytest.approx(8 / 4)
    assert stats.acceptance_length == pytest.approx(1 + 4 / 4)
    assert stats.accepted_per_round_no_bonus == pytest.approx(1.0)
    assert stats.unconditional.tolist() == pytest.approx([2 / 3, 1 / 3, 1 / 2])
    assert stats.conditional.tolist() == pytest.approx([2 / 3, 1 / 2, 1.0])


def test_inconsistent_rounds_raise():
    with pytest.raises(ValueError, match="num_accepted <= verify_len"):
        AcceptanceStats(3).update(torch.tensor([1]), torch.tensor([2]), torch.tensor([3]))


def test_repeat_rate_counts_adjacent_equal_drafts_and_merges():
    stats = AcceptanceStats(4)
    assert all(math.isnan(x) for x in stats.repeat_rate.tolist())
    stats.update(torch.tensor([4, 0]), torch.tensor([1, 0]), torch.tensor([2, 1]),
                 torch.tensor([[5, 5, 5, 7], [1, 2, 2, 2]]))
    stats.update(torch.tensor([0]), torch.tensor([0]), torch.tensor([1]))  # a round that drafted nothing
    other = AcceptanceStats(4)
    other.update(torch.tensor([2]), torch.tensor([2]), torch.tensor([3]), torch.tensor([[9, 8, 9, 9]]))
    merged = stats.merge(other)
    assert merged.drafted == 3 and merged.rounds == 4
    assert merged.repeat_rate.tolist() == pytest.approx([1 / 3, 2 / 3, 2 / 3])
    assert merged.as_dict()["draft_repeat_rate"] == pytest.approx([1 / 3, 2 / 3, 2 / 3])


def test_draft_tokens_of_the_wrong_shape_raise():
    with pytest.raises(ValueError, match="draft_tokens"):
        AcceptanceStats(3).update(torch.tensor([1]), torch.tensor([0]), torch.tensor([1]), torch.tensor([[1, 2]]))
