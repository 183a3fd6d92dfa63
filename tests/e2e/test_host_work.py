"""What a decode round asks of the host: the counting tool itself, trusted inputs, and the round's budget."""

import pytest
import torch

from benchmarks.host_trace import HostTrace
from dspark import trusted_values
from dspark._checks import check_once
from dspark.runtime.decoding import SamplingConfig, SpeculativeDecoder
from dspark.scheduler import FixedLength, Threshold
from dspark.verify import verify
from tests.e2e.conftest import drafter_for, tiny_target


def test_the_trace_counts_reads_of_device_values_and_nothing_the_host_already_holds():
    layer = torch.nn.Linear(4, 4)
    with HostTrace([layer]) as trace:
        on_device = layer(torch.ones(2, 4))  # computed from a parameter: device memory
        on_host = torch.ones(3)
        int(on_host.sum())
        on_host.tolist()
        float(on_device.sum().detach())  # item(): one wait
        on_device.tolist()  # one more
        on_device.cpu()  # and one more
        on_device[on_device > 0]  # the output's size comes from device values: one more
        moved = on_host.to(torch.device("cpu"))  # a copy to the device, not a wait
        moved.tolist()  # reading it back is a wait
        torch.zeros(2, device="cpu").sum().item()  # a factory told its device makes device memory
    counts = trace.counts["other"]
    assert counts["host_syncs"] == 6
    assert counts["host_to_device"] == 1
    assert counts["torch_ops"] >= 4  # the linear layer, the sums, the comparison and the masked read
    assert sum(trace.sync_sites.values()) == 6


def test_trusted_values_skip_the_checks_that_read_values_and_keep_those_of_shapes():
    probs = torch.full((1, 2, 3), 1 / 3)
    tokens = torch.zeros(1, 2, dtype=torch.long)
    bad_uniforms = torch.full((1, 2), 2.0)  # outside [0, 1)
    args = (tokens, probs, torch.full((1, 3, 3), 1 / 3), torch.tensor([2]), bad_uniforms, torch.zeros(1))
    with pytest.raises(ValueError, match="uniform draws"):
        verify(*args, backend="torch")
    with trusted_values():
        verify(*args, backend="torch")  # not read: the caller vouches for its draws
        with pytest.raises(ValueError, match="shape"):
            verify(tokens[:, :1], *args[1:], backend="torch")


def test_trusted_checks_run_once_per_signature_and_still_refuse_what_they_have_not_seen():
    ran = []

    def check(t, n):
        ran.append(tuple(t.shape))
        if t.shape[0] != n:
            raise ValueError(f"t must have {n} rows")

    with trusted_values():
        check_once(check, torch.zeros(3), 3)
        check_once(check, torch.ones(3), 3)  # same shape, dtype and arguments: remembered
        assert ran == [(3,)]
        for _ in range(2):  # a failure is never remembered
            with pytest.raises(ValueError, match="3 rows"):
                check_once(check, torch.zeros(4), 3)
        check_once(check, torch.zeros(3, dtype=torch.float64), 3)  # another dtype runs the check again
    check_once(check, torch.zeros(3), 3)  # outside trusted values every call is checked
    assert ran == [(3,), (4,), (4,), (3,), (3,)]


def _host_syncs_over_three_rounds(temperature: float, **decoder_options) -> tuple[int, object]:
    """Host reads of device values over three rounds of a running batch on the PyTorch backend (after one round
    that warms up), and the library lines that asked for them."""
    target = tiny_target(vocab=64)
    drafter = drafter_for(target)
    trace = HostTrace([target.model, drafter])
    config = SamplingConfig(max_new_tokens=40, temperature=temperature, seed=1, eos_token_id=63)
    with trace:
        decoder = SpeculativeDecoder(target, drafter, config, backend="torch", **decoder_options)
        decoder.start([[1, 2, 3], [4, 5, 6, 7]])
        decoder.step()
        trace.reset()
        for _ in range(3):
            decoder.step()
    return sum(counter["host_syncs"] for counter in trace.counts.values()), trace.sync_sites


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_round_waits_for_the_device_only_for_its_verify_lengths_and_its_results(temperature):
    """On the PyTorch backend, a round of a running batch reads device values twice: the verify lengths (they size
    the target's pass) and the round's results (one copy). The drafter's context cache grows from counts the host
    holds, and the scheduler here sends every slot without reading anything."""
    syncs, sites = _host_syncs_over_three_rounds(temperature, scheduler=FixedLength(4))
    assert syncs == 2 * 3, sites


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_fixed_width_round_waits_for_the_device_once(temperature):
    """With the verify pass always γ + 1 wide, its shape no longer waits on the scheduler's lengths: one read a
    round, the results."""
    syncs, sites = _host_syncs_over_three_rounds(temperature, scheduler=FixedLength(2), fixed_width=True)
    assert syncs == 3, sites


def test_a_fixed_width_pass_commits_the_tokens_of_a_pass_as_wide_as_the_longest_length():
    """Greedy decoding with lengths that differ between requests and rounds (a confidence threshold): the slots a
    fixed-width pass feeds past a request's length are masked and rolled back, so the tokens, the verify lengths
    and the acceptance are those of the narrower pass."""
    target = tiny_target(vocab=64)
    drafter = drafter_for(target)
    config = SamplingConfig(max_new_tokens=24, temperature=0.0, eos_token_id=63)
    prompts = [[1, 2, 3], [4, 5, 6, 7], [9]]
    runs = []
    for fixed_width in (False, True):
        decoder = SpeculativeDecoder(target, drafter, config, scheduler=Threshold(0.5), backend="torch",
                                     fixed_width=fixed_width)
        runs.append(decoder.start(prompts).run())
    narrow, fixed = runs
    assert fixed.tokens == narrow.tokens
    for name in ("rounds", "committed", "accepted", "proposed", "reached", "accepted_at"):
        assert torch.equal(torch.as_tensor(getattr(fixed.stats, name)), torch.as_tensor(getattr(narrow.stats, name)))
    lengths = narrow.stats.verify_length_counts
    assert (lengths > 0).sum() >= 2, f"the threshold must vary the lengths: {lengths.tolist()}"
