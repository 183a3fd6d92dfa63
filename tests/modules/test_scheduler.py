import itertools

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from dspark.scheduler import (
    FixedLength,
    PrefixScheduler,
    ProductionScheduler,
    SPSTable,
    Threshold,
    allocate_top_k,
    counterexample_first_token_probability,
    schedule_greedy,
    survival_of,
)
from dspark.testing import assert_equal
from tests.strategies import schedule_inputs


def _feasible(confidence, sps, kw):
    return kw["base_tokens"] + confidence.shape[0] * (1 + kw["min_len"]) <= sps.max_tokens


@given(inputs=schedule_inputs(), early_stop=st.booleans(), ties=st.booleans())
def test_greedy_matches_reference(inputs, early_stop, ties):
    confidence, sps, valid_len, kw = inputs
    if ties:
        confidence = (confidence * 4).round() / 4
    if not _feasible(confidence, sps, kw):
        with pytest.raises(ValueError, match="SPS table stops"):
            schedule_greedy(confidence, sps, valid_len, early_stop=early_stop, **kw)
        return
    got = schedule_greedy(confidence, sps, valid_len, early_stop=early_stop, backend="torch", **kw)
    want = schedule_greedy(confidence, sps, valid_len, early_stop=early_stop, backend="reference", **kw)
    assert_equal(got, want, name="verify_len")
    tokens = kw["base_tokens"] + confidence.shape[0] + int(got.sum())
    assert tokens <= sps.max_tokens, "the verify pass exceeds the SPS table's capacity"
    cap = confidence.shape[1] if valid_len is None else valid_len
    if kw["max_len"] is not None:
        cap = torch.as_tensor(cap).clamp(max=kw["max_len"])
    assert bool((got <= cap).all())


@given(inputs=schedule_inputs(ties=True), budget=st.integers(0, 20))
def test_top_k_matches_reference_and_respects_budget(inputs, budget):
    confidence, _, valid_len, kw = inputs
    got = allocate_top_k(confidence, budget, valid_len, min_len=kw["min_len"], max_len=kw["max_len"], backend="torch")
    want = allocate_top_k(confidence, budget, valid_len, min_len=kw["min_len"], max_len=kw["max_len"],
                          backend="reference")
    assert_equal(got, want, name="verify_len")
    forced = torch.full_like(got, kw["min_len"]).minimum(got)
    assert int(got.sum()) <= max(budget, int(forced.sum()))


def _admitted_are_the_top_of_the_ranking(confidence, lengths):
    a = survival_of(confidence)
    admitted = [(float(a[r, j]), j) for r in range(a.shape[0]) for j in range(int(lengths[r]))]
    rejected = [(float(a[r, j]), j) for r in range(a.shape[0]) for j in range(int(lengths[r]), a.shape[1])
                if a[r, j] > 0]
    # Every admitted entry ranks at or above every candidate left out (survival desc, then position asc).
    for value, pos in admitted:
        for other_value, other_pos in rejected:
            assert value > other_value or (value == other_value and pos <= other_pos)


@given(inputs=schedule_inputs(ties=True))
def test_admitted_set_is_a_top_set_of_prefixes(inputs):
    confidence, sps, _, kw = inputs
    kw = dict(kw, min_len=0, max_len=None)
    if not _feasible(confidence, sps, kw):
        return
    _admitted_are_the_top_of_the_ranking(confidence, schedule_greedy(confidence, sps, **kw))
    _admitted_are_the_top_of_the_ranking(confidence, allocate_top_k(confidence, 5))


@given(inputs=schedule_inputs(), data=st.data())
def test_non_anticipation(inputs, data):
    """Whether slot j is admitted never depends on c_{j+1..γ} of the same request."""
    confidence, sps, valid_len, kw = inputs
    if not _feasible(confidence, sps, kw):
        return
    r = data.draw(st.integers(0, confidence.shape[0] - 1))
    j = data.draw(st.integers(1, confidence.shape[1]))
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 1000)))
    changed = confidence.clone()
    changed[r, j:] = torch.rand(confidence.shape[1] - j, generator=gen, dtype=torch.float64)
    before = schedule_greedy(confidence, sps, valid_len, **kw)[r]
    after = schedule_greedy(changed, sps, valid_len, **kw)[r]
    assert min(int(before), j) == min(int(after), j)
    before_k = allocate_top_k(confidence, 4, valid_len)[r]
    after_k = allocate_top_k(changed, 4, valid_len)[r]
    assert min(int(before_k), j) == min(int(after_k), j)


def test_global_argmax_anticipates():
    """Without the early stop, slot 1's admission depends on c_2: the App. A failure mode."""
    sps = SPSTable(torch.tensor([1.0, 1.0, 0.5, 0.45], dtype=torch.float64))
    confident = torch.tensor([[0.8, 1.0]], dtype=torch.float64)
    doubtful = torch.tensor([[0.8, 0.0]], dtype=torch.float64)
    assert schedule_greedy(confident, sps, early_stop=False).item() == 2
    assert schedule_greedy(doubtful, sps, early_stop=False).item() == 0
    assert schedule_greedy(confident, sps).item() == schedule_greedy(doubtful, sps).item() == 0


def test_appendix_a_counterexample_is_exact():
    assert counterexample_first_token_probability(early_stop=False) == pytest.approx(0.85, abs=1e-12)
    assert counterexample_first_token_probability(early_stop=True) == pytest.approx(0.70, abs=1e-12)


@given(inputs=schedule_inputs(), steep=st.booleans())
def test_when_certain_drafts_would_not_be_sent_none_are(inputs, steep):
    """PrefixScheduler.may_send_drafts is the decode loop's licence to skip drafting: whenever it says no, no
    confidence whatsoever makes Algorithm 1 send a draft. ``steep`` adds tables where one more token doubles
    the pass (a CPU's 1 → 2 token step), so that both answers occur."""
    confidence, sps, valid_len, kw = inputs
    requests, gamma = confidence.shape
    if steep:
        sps = SPSTable.from_latencies([1, 2, sps.max_tokens], [1.0, 2.1, 2.1 + 0.01 * sps.max_tokens])
    if not _feasible(confidence, sps, kw):
        return
    policy = PrefixScheduler(sps, **kw)
    lengths = policy(confidence, valid_len)
    full = valid_len if valid_len is not None else torch.full((requests,), gamma)
    if not policy.may_send_drafts(full, gamma):
        assert_equal(lengths, torch.zeros_like(lengths), name="verify lengths when even certainty sends none")


def test_backoff_skips_drafting_for_doubling_runs_of_rounds_after_empty_ones():
    """Rounds as the decode loop runs them: ``D`` drafted (and scheduled), ``-`` skipped. Empty drafted rounds
    pause drafting for 1, 2, 4, then 4 (the cap) rounds; a round that sends drafts ends the back-off."""
    policy = PrefixScheduler(SPSTable.linear(1.0, 0.05, 64), backoff=4)
    full, gamma = torch.tensor([3]), 3

    def rounds(confidence: float, count: int) -> str:
        seen = ""
        for _ in range(count):
            if policy.may_send_drafts(full, gamma):
                policy(torch.full((1, gamma), confidence, dtype=torch.float64), full)
                seen += "D"
            else:
                seen += "-"
        return seen

    assert rounds(0.0, 16) == "D-D--D----D----D"
    assert rounds(1.0, 6) == "----DD"  # the pause left over, then drafts are sent and the back-off ends
    with pytest.raises(ValueError, match="backoff"):
        PrefixScheduler(SPSTable.linear(1.0, 0.05, 64), backoff=-1)


def test_fixed_length_zero_never_drafts():
    assert not FixedLength(0).may_send_drafts(torch.tensor([3]), 3)
    assert FixedLength(1).may_send_drafts(torch.tensor([3]), 3)


@given(requests=st.integers(1, 3), gamma=st.integers(1, 3), seed=st.integers(0, 2**31),
       fixed=st.floats(0.1, 3.0), per_token=st.floats(0.01, 1.0))
def test_equals_brute_force_under_unimodal_sps(requests, gamma, seed, fixed, per_token):
    gen = torch.Generator().manual_seed(seed)
    confidence = torch.rand(requests, gamma, generator=gen, dtype=torch.float64)
    sps = SPSTable.linear(fixed, per_token, requests * (gamma + 1))
    a = survival_of(confidence)

    def theta(lengths):
        tau = requests + sum(float(a[r, :length].sum()) for r, length in enumerate(lengths))
        return tau * sps(requests + sum(lengths))

    best = max(theta(ls) for ls in itertools.product(range(gamma + 1), repeat=requests))
    got = theta(schedule_greedy(confidence, sps).tolist())
    assert got == pytest.approx(best, rel=1e-12)


@given(inputs=schedule_inputs(ties=True), seed=st.integers(0, 1000))
def test_independent_of_request_order(inputs, seed):
    confidence, sps, valid_len, kw = inputs
    if not _feasible(confidence, sps, kw):
        return
    perm = torch.randperm(confidence.shape[0], generator=torch.Generator().manual_seed(seed))
    permuted_valid = None if valid_len is None else valid_len[perm]
    for early_stop in (True, False):
        base = schedule_greedy(confidence, sps, valid_len, early_stop=early_stop, **kw)
        assert_equal(schedule_greedy(confidence[perm], sps, permuted_valid, early_stop=early_stop, **kw), base[perm])
    base = allocate_top_k(confidence, 3, valid_len)
    assert_equal(allocate_top_k(confidence[perm], 3, permuted_valid), base[perm])


def test_tied_group_is_admitted_whole_or_not_at_all():
    confidence = torch.tensor([[0.9, 0.5], [0.9, 0.5], [0.6, 0.1]], dtype=torch.float64)
    assert allocate_top_k(confidence, 1).tolist() == [0, 0, 0]
    assert allocate_top_k(confidence, 2).tolist() == [1, 1, 0]
    assert allocate_top_k(confidence, 3).tolist() == [1, 1, 1]


def test_load_shrinks_verify_lengths():
    """More requests in a compute-bound regime: Algorithm 1 sends fewer drafts per request."""
    sps = SPSTable.roofline(weight_bytes=16e9, flops_per_token=16e9, bandwidth_bytes_per_s=4.8e12,
                            peak_flops=9.9e14, overhead_s=2e-3, max_tokens=4096)
    confidence = torch.full((1, 7), 0.8, dtype=torch.float64)
    light = schedule_greedy(confidence.expand(2, 7), sps).float().mean()
    heavy = schedule_greedy(confidence.expand(256, 7), sps).float().mean()
    assert light == 7 and heavy < light


def test_policies():
    confidence = torch.tensor([[0.9, 0.8, 0.3, 0.9], [0.2, 0.9, 0.9, 0.9]], dtype=torch.float64)
    valid = torch.tensor([4, 2])
    assert FixedLength(3)(confidence, valid).tolist() == [3, 2]
    assert Threshold(0.5)(confidence, valid).tolist() == [2, 0]
    sps = SPSTable.linear(1.0, 0.05, 20)
    assert_equal(PrefixScheduler(sps)(confidence, valid), schedule_greedy(confidence, sps, valid))


def test_production_budget_comes_from_confidences_two_steps_old():
    sps = SPSTable.linear(1.0, 0.05, 40)
    steps = [torch.full((3, 5), v, dtype=torch.float64) for v in (0.95, 0.3, 0.6, 0.9)]
    policy = ProductionScheduler(sps, lag=2)
    results = [policy(c) for c in steps]
    # From step 2 on, the budget is the global-argmax size on the confidences of step t-2.
    for t in (2, 3):
        budget = int(schedule_greedy(steps[t - 2], sps, early_stop=False).sum())
        assert_equal(results[t], allocate_top_k(steps[t], budget))
    assert int(results[2].sum()) == int(schedule_greedy(steps[0], sps, early_stop=False).sum())


def test_sps_table_from_latencies_is_monotone_and_interpolated():
    table = SPSTable.from_latencies([1, 4, 8], [0.010, 0.009, 0.020])
    assert table.max_tokens == 8
    latency = 1 / table.sps[1:]
    assert bool((latency[1:] >= latency[:-1]).all())
    assert latency[5].item() == pytest.approx(0.010 + (0.020 - 0.010) * 2 / 4)
    with pytest.raises(ValueError, match="non-increasing"):
        SPSTable(torch.tensor([1.0, 1.0, 2.0]))
    with pytest.raises(ValueError, match="beyond"):
        SPSTable.from_latencies([1, 2], [0.1, 0.2], max_tokens=5)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda c, s: schedule_greedy(c * 2, s), r"\[0, 1\]"),
        (lambda c, s: schedule_greedy(c, s, torch.tensor([5, 1])), "valid_len"),
        (lambda c, s: schedule_greedy(c, s, min_len=2, max_len=1), "min_len"),
        (lambda c, s: schedule_greedy(c, SPSTable.linear(1, 1, 1)), "SPS table stops"),
        (lambda c, s: allocate_top_k(c, -1), "budget"),
    ],
)
def test_bad_schedule_input_raises(call, message):
    with pytest.raises(ValueError, match=message):
        call(torch.full((2, 3), 0.7, dtype=torch.float64), SPSTable.linear(1.0, 0.1, 10))


def test_profile_sps_takes_medians_and_makes_the_table_monotone(monkeypatch):
    """profile_sps times step(B) with perf_counter, the counts in turn; a fake clock makes its arithmetic checkable."""
    import dspark.scheduler as scheduler

    latency = {1: [0.010, 0.030, 0.011], 4: [0.012, 0.012, 0.013], 8: [0.011, 0.020, 0.020]}
    clock = {"t": 0.0, "pending": 0.0}
    calls = {b: iter(v) for b, v in latency.items()}
    order = []

    def step(tokens):
        order.append(tokens)
        clock["pending"] = next(calls[tokens], 0.0)

    def perf_counter():
        clock["t"] += clock["pending"]
        clock["pending"] = 0.0
        return clock["t"]

    monkeypatch.setattr(scheduler.time, "perf_counter", perf_counter)
    table = scheduler.profile_sps(step, [1, 4, 8], repeats=3, warmup=0)
    assert order == [1, 4, 8] * 3, "the counts take turns, so that a slow stretch does not fall on one count"
    # medians 0.011, 0.012, 0.020 seconds; monotone already; interpolated in between
    assert table.sps[1].item() == pytest.approx(1 / 0.011)
    assert table.sps[4].item() == pytest.approx(1 / 0.012)
    assert table.sps[8].item() == pytest.approx(1 / 0.020)
    assert table.max_tokens == 8


@pytest.mark.parametrize("backend", ["reference", "torch"])
def test_bad_tables_are_refused_alike_on_every_tier(backend):
    confidence = torch.full((6, 4), 0.5)
    with pytest.raises(ValueError, match="SPSTable"):
        schedule_greedy(confidence, 0.05, backend=backend)
    with pytest.raises(ValueError, match="SPSTable"):
        schedule_greedy(confidence, torch.ones(8), backend=backend)
    with pytest.raises(ValueError, match="SPS table stops at 4"):  # six anchors alone need six tokens
        schedule_greedy(confidence, SPSTable.linear(1.0, 0.1, 4), backend=backend)


def test_triton_backend_on_cpu_tensors_says_what_it_needs(monkeypatch):
    from dspark.backend import resolve_backend

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="needs CUDA tensors"):
        resolve_backend("triton", torch.zeros(2))
    assert resolve_backend("torch", torch.zeros(2)) == "torch"


def test_smoothed_production_budget_reads_the_moving_average_two_steps_old():
    sps = SPSTable.linear(1.0, 0.05, 40)
    steps = [torch.full((3, 5), v, dtype=torch.float64) for v in (0.95, 0.3, 0.6, 0.9)]
    policy = ProductionScheduler(sps, lag=2, smoothing=0.8)
    results = [policy(c) for c in steps]
    averages = [steps[0]]
    for c in steps[1:]:
        averages.append(0.8 * averages[-1] + 0.2 * c)
    for t in (2, 3):
        budget = int(schedule_greedy(averages[t - 2], sps, early_stop=False).sum())
        assert_equal(results[t], allocate_top_k(steps[t], budget))
    assert policy.name == "production-ema0.8"
    policy(torch.full((2, 5), 0.5, dtype=torch.float64))  # other requests: the history starts afresh
    assert len(policy.history) == 1


def _rank_keys(survival: torch.Tensor, lengths: torch.Tensor):
    """(admitted, candidates left out) as (survival, position) pairs, for requests' prefixes ``lengths``."""
    slots = torch.arange(1, survival.shape[1] + 1)
    admitted = slots <= lengths[:, None]
    positions = slots.expand_as(survival)
    left_out = ~admitted & (survival > 0)
    return (survival[admitted], positions[admitted]), (survival[left_out], positions[left_out])


@given(requests=st.integers(256, 512), seed=st.integers(0, 2**31), ties=st.booleans(),
       per_token=st.floats(1e-5, 1e-3))
def test_policy_invariants_at_serving_concurrency(requests, seed, ties, per_token):
    """At R up to 512 (γ = 7): Algorithm 1 admits a top set of prefixes, keeps its early stop, fits the table;
    top-K with Algorithm 1's own count returns Algorithm 1's lengths; top-K never exceeds its budget."""
    gamma = 7
    gen = torch.Generator().manual_seed(seed)
    confidence = torch.rand(requests, gamma, generator=gen, dtype=torch.float64)
    if ties:
        confidence = (confidence * 4).round() / 4
    sps = SPSTable.linear(0.004, per_token, requests * (gamma + 1))
    lengths = schedule_greedy(confidence, sps, backend="torch")
    survival = survival_of(confidence)
    (kept_value, kept_pos), (out_value, out_pos) = _rank_keys(survival, lengths)
    if kept_value.numel() and out_value.numel():
        # Every admitted entry ranks at or above every one left out (survival desc, then position asc).
        worst = kept_value.min()
        assert bool((out_value <= worst).all())
        assert bool((out_pos[out_value == worst] >= kept_pos[kept_value == worst].max()).all())
    # The early stop: Θ rose with the last admitted group, and admitting the next whole group would not raise it.
    tokens = requests + int(lengths.sum())
    tau = requests + float(kept_value.sum())
    theta = tau * sps(tokens)
    if out_value.numel():
        best = out_value.max()
        group = (out_value == best) & (out_pos == out_pos[out_value == best].min())
        grown = tokens + int(group.sum())
        if grown <= sps.max_tokens:
            assert (tau + float(out_value[group].sum())) * sps(grown) <= theta
    assert_equal(allocate_top_k(confidence, int(lengths.sum())), lengths, name="top-K with Algorithm 1's count")
    budget = int(torch.randint(0, requests * gamma, (1,), generator=gen))
    assert int(allocate_top_k(confidence, budget).sum()) <= budget
