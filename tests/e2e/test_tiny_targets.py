"""Speculative decoding on tiny random targets: lossless, rolled back exactly, any architecture."""

import pytest
import torch

import dspark.linear
import dspark.runtime.profiling
from dspark.linear import SKINNY_ROWS, few_row_layout, skinny_layout, skinny_min_rows, skinny_rows
from dspark.runtime.decoding import SamplingConfig, SpeculativeDecoder, generate, speculative_generate
from dspark.runtime.profiling import choose_few_row_layout, profile_verify_sps
from dspark.scheduler import FixedLength, PrefixScheduler, ProductionScheduler, SPSTable, Threshold
from dspark.testing import assert_close, assert_close_float64, chi_square_pvalue
from tests.e2e.conftest import drafter_for, eagle3_for, tiny_target

PROMPTS = [[1, 2, 3, 4, 5], [7, 8], [9, 10, 11, 12, 13, 14, 15], [3], [2, 11, 6]]


def policies():
    sps = SPSTable.linear(1.0, 0.05, 64)
    return [FixedLength(4), FixedLength(2), Threshold(0.5), PrefixScheduler(sps), PrefixScheduler(sps, backoff=4),
            ProductionScheduler(sps)]


# Every few-row layout the start-up profile may keep: verify passes then multiply differently from one-token steps.
LAYOUTS = [(SKINNY_ROWS, "transposed", 1), (0, "transposed", 1)] + (
    [(SKINNY_ROWS, "packed", 2)] if dspark.linear.packed_layout_available() else [])


@pytest.mark.parametrize("architecture, layout", [("llama", layout) for layout in LAYOUTS] + [
    ("qwen3", LAYOUTS[0])])
def test_greedy_speculative_equals_greedy_target(architecture, layout):
    target = tiny_target(architecture)
    drafter = drafter_for(target)
    config = SamplingConfig(max_new_tokens=24, temperature=0.0)
    with few_row_layout(*layout):
        plain = generate(target, PROMPTS, config).tokens
        for policy in policies():
            spec = speculative_generate(target, drafter, PROMPTS, config, scheduler=policy).tokens
            assert spec == plain, policy.name
            single = [speculative_generate(target, drafter, [p], config, scheduler=policy).tokens[0] for p in PROMPTS]
            assert single == plain, f"{policy.name}, batch 1"


def test_each_request_counts_its_own_rounds():
    """Per-request rounds add up to the batch's, and a request's τ is its committed tokens over its rounds."""
    target = tiny_target("llama")
    drafter = drafter_for(target)
    config = SamplingConfig(max_new_tokens=24, temperature=0.0)
    result = speculative_generate(target, drafter, PROMPTS, config, scheduler=FixedLength(4))
    assert sum(result.request_rounds) == result.stats.rounds
    assert sum(len(t) - 1 for t in result.tokens) == result.stats.committed
    assert max(result.request_rounds) == result.steps
    single = speculative_generate(target, drafter, [PROMPTS[1]], config, scheduler=FixedLength(4))
    assert single.request_rounds == [single.steps] and single.request_tau == [single.stats.tau]


def test_rounds_no_draft_could_pay_for_skip_the_drafter(monkeypatch):
    """A profile where every token added to the pass costs more than the pass's average token: Algorithm 1 could
    send no draft even at confidence 1, so the loop runs plain target steps without drafting, and the output is
    the target's."""
    target = tiny_target()
    drafter = drafter_for(target)
    calls = []
    original = drafter.draft
    monkeypatch.setattr(drafter, "draft", lambda *a, **k: calls.append(1) or original(*a, **k))
    config = SamplingConfig(max_new_tokens=12, temperature=0.0)
    steep = PrefixScheduler(SPSTable.from_latencies([1, 64], [1.0, 80.0]))
    decoder = SpeculativeDecoder(target, drafter, config, scheduler=steep).start(PROMPTS)
    result = decoder.run()
    assert result.tokens == generate(target, PROMPTS, config).tokens
    assert not calls and decoder.rounds_without_drafts == decoder.steps > 0
    cheap = PrefixScheduler(SPSTable.linear(1.0, 1e-4, 64))  # every draft pays: the drafter runs
    assert speculative_generate(target, drafter, PROMPTS, config, scheduler=cheap).tokens == result.tokens
    assert calls


def test_backoff_drafts_less_after_empty_rounds_and_stays_lossless(monkeypatch):
    """A drafter whose confidences are all 0: Algorithm 1 sends nothing in any drafted round, so with back-off
    the loop drafts in rounds 1, 3, 6, 11, … only; the output is still the target's."""
    import dataclasses

    target = tiny_target()
    drafter = drafter_for(target)
    calls = []
    original = drafter.draft

    def unsure(*args, **kwargs):
        calls.append(1)
        out = original(*args, **kwargs)
        return dataclasses.replace(out, confidence=torch.zeros_like(out.confidence))

    monkeypatch.setattr(drafter, "draft", unsure)
    config = SamplingConfig(max_new_tokens=16, temperature=0.0)
    policy = PrefixScheduler(SPSTable.linear(1.0, 0.05, 64), backoff=4)
    result = speculative_generate(target, drafter, PROMPTS, config, scheduler=policy)
    assert result.tokens == generate(target, PROMPTS, config).tokens
    assert len(calls) == result.steps - result.rounds_without_drafts < result.steps // 2, (len(calls), result.steps)


def test_rows_of_rounds_without_drafts_reach_the_drafter_before_it_drafts(monkeypatch):
    """Back-off leaves runs of rounds that draft nothing, whose rows wait; whenever the drafter runs, its cache
    holds every committed token before the anchor and computes what a cache filled in one go would, and a
    request that finishes meanwhile takes its waiting rows with it."""
    import dataclasses

    target = tiny_target(vocab=16)
    drafter = drafter_for(target)
    policy = PrefixScheduler(SPSTable.linear(1.0, 0.05, 64), backoff=4)
    decoder = SpeculativeDecoder(target, drafter, SamplingConfig(max_new_tokens=20, temperature=1.0, seed=3),
                                 scheduler=policy)
    original = drafter.draft
    checked = []

    def unsure_and_checked(anchor, cache, *args, **kwargs):
        assert torch.equal(cache.lengths, decoder.state.next_pos)
        for row, req in enumerate(decoder.active.tolist()):
            committed = PROMPTS[req] + decoder.out[req][:-1]
            step = target.forward(target.new_state(1), torch.tensor([committed]),
                                  torch.arange(len(committed))[None], torch.ones(1, len(committed), dtype=torch.bool))
            fresh = drafter.new_cache(1)
            drafter.extend_cache(fresh, step.taps, torch.tensor([len(committed)]))
            want = drafter.forward_cached(anchor[row: row + 1], fresh)
            got = drafter.forward_cached(anchor[row: row + 1], _single_cache(cache, row))
            # fp32 target features from a batched cache with holes vs one fresh pass: same sums, other order.
            assert_close(got, want, rtol=1e-4, atol=1e-4, name=f"drafter hidden, request {req}")
        checked.append(decoder.rounds_without_drafts)
        out = original(anchor, cache, *args, **kwargs)
        return dataclasses.replace(out, confidence=torch.zeros_like(out.confidence))

    monkeypatch.setattr(drafter, "draft", unsure_and_checked)
    decoder.start(PROMPTS)
    finished_while_waiting = False
    while not decoder.finished:
        before = len(decoder.active)
        decoder.step()
        finished_while_waiting |= bool(decoder.waiting) and len(decoder.active) < before
    assert len(set(checked)) >= 3, f"the drafter must run after at least two runs of rounds without drafts: {checked}"
    assert finished_while_waiting


def test_eagle3_chain_drafter_is_lossless_and_rolls_back():
    """The EAGLE-3 baseline decodes through the same decoder: greedy output is the target's, and after
    rounds with rejections its cache gives the chain a fresh cache would."""
    target = tiny_target("qwen3", vocab=16)
    drafter = eagle3_for(target)
    config = SamplingConfig(max_new_tokens=24, temperature=0.0)
    assert speculative_generate(target, drafter, PROMPTS, config).tokens == generate(target, PROMPTS, config).tokens
    decoder = SpeculativeDecoder(target, drafter, SamplingConfig(max_new_tokens=40, temperature=1.0, seed=3))
    decoder.start(PROMPTS)
    for _ in range(5):
        decoder.step()
    assert 0 < decoder.stats.accepted < int(decoder.stats.proposed.sum()), "need accepts and rejects"
    for row, req in enumerate(decoder.active.tolist()):
        committed = PROMPTS[req] + decoder.out[req][:-1]
        step = target.forward(target.new_state(1), torch.tensor([committed]), torch.arange(len(committed))[None],
                              torch.ones(1, len(committed), dtype=torch.bool))
        fresh = drafter.new_cache(1)
        drafter.extend_cache(fresh, step.taps, torch.tensor([len(committed)]), torch.tensor([committed]))
        live = _single_cache(decoder.cache, row)
        anchor = torch.tensor([decoder.out[req][-1]])
        with torch.no_grad():
            want = drafter.chain_logits(anchor, fresh, lambda j, logits: logits.argmax(-1))
            got = drafter.chain_logits(anchor, live, lambda j, logits: logits.argmax(-1))
        for j, (g, w) in enumerate(zip(got, want)):
            # fp32 target features from a batched, rolled-back cache vs one fresh pass: same sums, other order.
            assert_close(g, w, rtol=1e-4, atol=1e-4, name=f"chain logits, request {req}, step {j}")


def test_eos_and_max_tokens_end_requests():
    target = tiny_target()
    drafter = drafter_for(target)
    plain = generate(target, PROMPTS, SamplingConfig(max_new_tokens=30, temperature=0.0)).tokens
    eos = plain[0][5]  # a token the first request emits: it must stop right after it
    config = SamplingConfig(max_new_tokens=30, temperature=0.0, eos_token_id=eos)
    spec = speculative_generate(target, drafter, PROMPTS, config).tokens
    assert spec == generate(target, PROMPTS, config).tokens
    assert spec[0] == plain[0][: plain[0].index(eos) + 1]
    assert all(len(t) <= 30 for t in spec)


@pytest.mark.parametrize("max_batch", [1, 2, 4])
def test_continuous_batching_gives_each_request_the_tokens_it_gets_alone(max_batch):
    # An EOS ends requests at different rounds, so places come free at different times in the two decoders.
    target = tiny_target()
    greedy = SamplingConfig(max_new_tokens=20, temperature=0.0)
    alone = [generate(target, [p], greedy).tokens[0] for p in PROMPTS]
    config = SamplingConfig(max_new_tokens=20, temperature=0.0, eos_token_id=alone[0][4])
    alone = [generate(target, [p], config).tokens[0] for p in PROMPTS]
    assert len({len(t) for t in alone}) > 1, "the EOS must end some requests early"
    assert generate(target, PROMPTS, config, max_batch=max_batch).tokens == alone
    for drafter in (drafter_for(target), eagle3_for(target)):
        for policy in policies()[:4]:
            spec = speculative_generate(target, drafter, PROMPTS, config, scheduler=policy, max_batch=max_batch)
            assert spec.tokens == alone, (type(drafter).__name__, policy.name)


def test_requests_that_join_a_running_batch_keep_caches_equal_to_a_fresh_prefill():
    """Continuous batching merges each prefilled request into the running caches: after requests have finished and
    others joined, every active request's caches compute what a fresh prefill of its text would."""
    target = tiny_target(vocab=16)
    drafter = drafter_for(target)
    decoder = SpeculativeDecoder(target, drafter, SamplingConfig(max_new_tokens=12, temperature=1.0, seed=3))
    decoder.start(PROMPTS, max_batch=2)
    while len(decoder.pending) > 1:
        decoder.step()
    assert len(decoder.active) == 2 and set(decoder.active.tolist()) != {0, 1}, "a later prompt must have joined"
    _assert_caches_equal_a_fresh_prefill(target, drafter, decoder)


def test_a_running_batch_keeps_only_the_cache_slots_its_requests_hold():
    """Requests that leave a running batch take their cache slots with them: over 30 requests through 2 places the
    target's cache never holds more slots than two requests' text and one verify pass (before, it held every slot
    the batch had fed, growing with the requests served), and the tokens are those each request gets alone."""
    target = tiny_target(vocab=16)
    config = SamplingConfig(max_new_tokens=12, temperature=0.0)
    prompts = PROMPTS * 6
    decoder = SpeculativeDecoder(target, drafter_for(target), config)
    decoder.start(prompts, max_batch=2)
    widths = []
    while not decoder.finished:
        decoder.step()
        if decoder.state is not None and len(decoder.active):
            widths.append(decoder.state.valid.shape[1])
    gamma = decoder.drafter.config.block_size
    assert max(widths) <= 2 * (max(map(len, prompts)) + config.max_new_tokens + gamma + 1), max(widths)
    assert decoder.out == [generate(target, [p], config).tokens[0] for p in prompts]


@pytest.mark.parametrize("max_batch", [None, 1, 2])
def test_each_request_is_timed_from_its_arrival_to_its_last_token(max_batch):
    """Both decoders time every request: it arrives, has its first token, then its last, in that order. Under
    continuous batching a request arrives when a place comes free, so with one place each request arrives after the
    one before it finished; without a limit every request arrives at the start, before any first token."""
    target = tiny_target()
    config = SamplingConfig(max_new_tokens=6, temperature=0.0)
    for result in (generate(target, PROMPTS, config, max_batch=max_batch),
                   speculative_generate(target, drafter_for(target), PROMPTS, config, max_batch=max_batch)):
        times = result.request_timings
        assert len(times) == len(PROMPTS)
        for timing in times:
            assert 0 <= timing.arrived <= timing.first_token <= timing.finished <= result.seconds
        if max_batch == 1:
            assert all(later.arrived >= earlier.finished for earlier, later in zip(times, times[1:]))
        if max_batch is None:
            assert max(timing.arrived for timing in times) <= min(timing.first_token for timing in times)


@pytest.mark.parametrize("max_batch", [0, -1, 1.5, True, "2"])
def test_decoders_refuse_a_batch_limit_that_is_not_a_positive_int(max_batch):
    target = tiny_target()
    with pytest.raises(ValueError, match="max_batch must be None"):
        generate(target, PROMPTS, max_batch=max_batch)
    with pytest.raises(ValueError, match="max_batch must be None"):
        speculative_generate(target, drafter_for(target), PROMPTS, max_batch=max_batch)


def test_rollback_leaves_caches_equal_to_a_fresh_prefill():
    """After rounds with both acceptances and rejections, both caches compute what a fresh prefill would."""
    target = tiny_target(vocab=16)
    drafter = drafter_for(target)
    decoder = SpeculativeDecoder(target, drafter, SamplingConfig(max_new_tokens=40, temperature=1.0, seed=3))
    decoder.start(PROMPTS)
    for _ in range(5):
        decoder.step()
    stats = decoder.stats
    assert stats.accepted > 0 and stats.accepted < int(stats.proposed.sum()), "need accepts and rejects"
    _assert_caches_equal_a_fresh_prefill(target, drafter, decoder)


def _assert_caches_equal_a_fresh_prefill(target, drafter, decoder) -> None:
    """Each active request's target cache and drafter cache compute, for its anchor, what a fresh prefill of its
    committed text computes."""
    for row, req in enumerate(decoder.active.tolist()):
        committed = PROMPTS[req] + decoder.out[req][:-1]
        anchor = decoder.out[req][-1]
        fresh = target.model(input_ids=torch.tensor([committed + [anchor]])).logits[0, -1]
        # Feed the anchor through the live (rolled-back, perhaps merged) cache of this request alone.
        live = target.forward(_single(target, decoder.state, row), torch.tensor([[anchor]]),
                              decoder.state.next_pos[row: row + 1, None], torch.ones(1, 1, dtype=torch.bool))
        # fp32 attention over a cache with masked holes and padding vs without: same sums, different order.
        assert_close(live.logits[0, -1], fresh, rtol=1e-4, atol=1e-4, name=f"target logits, request {req}")
        step = target.forward(target.new_state(1), torch.tensor([committed]), torch.arange(len(committed))[None],
                              torch.ones(1, len(committed), dtype=torch.bool))
        fresh_cache = drafter.new_cache(1)
        drafter.extend_cache(fresh_cache, step.taps, torch.tensor([len(committed)]))
        assert int(decoder.cache.lengths[row]) == len(committed)
        with torch.no_grad():
            want = drafter.forward_cached(torch.tensor([anchor]), fresh_cache)
            got = drafter.forward_cached(torch.tensor([anchor]), _single_cache(decoder.cache, row))
        assert_close(got, want, rtol=1e-4, atol=1e-4, name=f"drafter hidden, request {req}")


def test_rejected_slots_leave_the_cache():
    """A round's slots that no request keeps are cropped, so the cache grows with the text, not the drafts:
    at batch 1 it holds exactly the committed tokens; in a batch, at most the longest request's count plus its
    padding and the holes of slots other requests kept."""
    target = tiny_target(vocab=16)
    drafter = drafter_for(target)
    config = SamplingConfig(max_new_tokens=30, temperature=1.0, seed=3)
    single = SpeculativeDecoder(target, drafter, config).start([PROMPTS[0]])
    batch = SpeculativeDecoder(target, drafter, config).start(PROMPTS)
    width = max(len(p) for p in PROMPTS)
    for _ in range(6):
        single.step()
        kept = batch.step()
        width += max(kept)
        assert single.state.valid.shape[1] == len(PROMPTS[0]) + len(single.out[0]) - 1  # the anchor is not fed yet
        assert single.state.cache.get_seq_length() == single.state.valid.shape[1]
        assert bool(single.state.valid.all())
        assert batch.state.valid.shape[1] == batch.state.cache.get_seq_length() <= width
    assert single.stats.accepted < int(single.stats.proposed.sum()), "need rejected drafts"


def _single(target, state, row):
    """A copy of one request's target state."""
    import copy

    single = copy.deepcopy(state)
    target.select(single, torch.tensor([row]))
    return single


def _single_cache(cache, row):
    import copy

    single = copy.deepcopy(cache)
    single.select(torch.tensor([row]))
    return single


# The joint law of the first two generated tokens, (t1 from the prefill, t2 through draft and
# verification), against the target's exact p(t1) p(t2 | t1): V = 12, 20,000 streams decoded as one
# batch under Algorithm 1, whose verify lengths depend on confidences of sampled drafts. Four new
# tokens are asked for, so the round after the prefill may verify up to two drafts. Chi-square over
# 144 cells at alpha = 1e-3; seeds fixed.
@pytest.mark.parametrize("temperature, top_k", [(1.0, None), (0.7, 5)], ids=["T=1", "T=0.7,top-k=5"])
def test_sampled_output_follows_the_target(temperature, top_k):
    vocab, samples, prompt = 12, 20_000, [3, 1, 4]
    target = tiny_target(vocab=vocab, seed=1)
    drafter = drafter_for(target, seed=2, block_size=3)
    config = SamplingConfig(max_new_tokens=4, temperature=temperature, top_k=top_k, seed=11)
    policy = PrefixScheduler(SPSTable.linear(1.0, 2e-5, samples * 4))
    result = speculative_generate(target, drafter, [prompt] * samples, config, scheduler=policy)
    stats = result.stats
    assert 0 < stats.accepted < int(stats.proposed.sum()), "verification must accept some drafts and reject others"
    pairs = torch.tensor([t[:2] for t in result.tokens])
    counts = torch.bincount(pairs[:, 0] * vocab + pairs[:, 1], minlength=vocab * vocab)
    from dspark.sampling import warp_logits

    with torch.no_grad():
        first = warp_logits(target.model(input_ids=torch.tensor([prompt])).logits[0, -1], temperature, top_k)
        contexts = torch.tensor([prompt + [t] for t in range(vocab)])
        second = warp_logits(target.model(input_ids=contexts).logits[:, -1], temperature, top_k)
    expected = first[:, None] * second
    p = chi_square_pvalue(counts, expected)
    assert p > 1e-3, f"speculative samples differ from the target (chi-square p = {p:.2e})"


def test_uniform_draws_stay_below_one_in_low_precision():
    from dspark.runtime.decoding import uniform_draws

    gen = torch.Generator().manual_seed(0)
    draws = uniform_draws((1_000_000,), gen, torch.bfloat16)
    # bf16 uniforms are widened to fp32 (a bf16 cast rounds about 1 in 500 draws up to exactly 1.0).
    assert draws.dtype == torch.float32 and float(draws.max()) < 1 and float(draws.min()) >= 0
    fp64 = torch.rand(1_000_000, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    assert int((fp64.to(torch.bfloat16) == 1).sum()) > 100  # the failure the widening avoids


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_drafters_decode_sampled_runs(dtype):
    """A bf16 or fp16 drafter at T = 1 over many draws: no draw rounds up to 1, and greedy stays lossless."""
    target = tiny_target("llama")
    drafter = drafter_for(target).to(dtype)
    prompts = PROMPTS * 4
    for seed in range(3):
        out = speculative_generate(target, drafter, prompts, SamplingConfig(max_new_tokens=16, temperature=1.0,
                                                                            seed=seed))
        assert all(len(t) == 16 for t in out.tokens)
    greedy = SamplingConfig(max_new_tokens=16, temperature=0.0)
    assert speculative_generate(target, drafter, prompts, greedy).tokens == generate(target, prompts, greedy).tokens


@pytest.mark.parametrize("prompts, config, match", [
    (torch.tensor([[1, 2, 3]]), SamplingConfig(), "list of token-id lists"),
    ("What is 2 + 2?", SamplingConfig(), "list of token-id lists"),
    ([[1.0, 2.0]], SamplingConfig(), "int token ids"),
    ([[1, 99]], SamplingConfig(), r"token ids must lie in \[0, 64\)"),
    ([[1, 2]], SamplingConfig(eos_token_id=64), "outside the target's vocabulary"),
    ([list(range(60)) * 8], SamplingConfig(max_new_tokens=40), "max_position_embeddings"),
])
def test_decoders_refuse_bad_prompts_and_settings(prompts, config, match):
    target = tiny_target("llama")
    drafter = drafter_for(target)
    with pytest.raises(ValueError, match=match):
        generate(target, prompts, config)
    with pytest.raises(ValueError, match=match):
        speculative_generate(target, drafter, prompts, config)


@pytest.mark.parametrize("settings, match", [
    (dict(max_new_tokens=2.5), "max_new_tokens"), (dict(max_new_tokens=0), "max_new_tokens"),
    (dict(temperature=float("inf")), "temperature"), (dict(temperature=float("nan")), "temperature"),
    (dict(top_p=1.5), "top_p"), (dict(eos_token_id=-1), "eos_token_id"), (dict(eos_token_id=2.0), "eos_token_id"),
])
def test_sampling_config_refuses_what_it_cannot_mean(settings, match):
    with pytest.raises(ValueError, match=match):
        SamplingConfig(**settings)


def test_drafter_config_takes_the_targets_own_taps_only():
    target = tiny_target("llama", taps=(1, 3))
    assert target.drafter_config(target_layer_ids=[1, 3]).target_layer_ids == [1, 3]
    with pytest.raises(ValueError, match="tap_layers"):
        target.drafter_config(target_layer_ids=[0, 2])


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("poison", [float("nan"), float("inf")])
def test_a_target_that_returns_non_finite_logits_is_refused(monkeypatch, temperature, poison):
    """Greedy verification reads only argmaxes, so it checks the maxima: a NaN or +inf logit anywhere is one."""
    target = tiny_target("llama")
    drafter = drafter_for(target)
    forward, calls = target.forward, []

    def poisoned(*args, **kwargs):
        step = forward(*args, **kwargs)
        calls.append(step)
        if len(calls) > 1:  # a verify pass, not the prefill
            step.logits[0, -1, 5] = poison
        return step

    monkeypatch.setattr(target, "forward", poisoned)
    with pytest.raises(ValueError, match="NaN or Inf"):
        speculative_generate(target, drafter, [[1, 2, 3]], SamplingConfig(max_new_tokens=8, temperature=temperature))
    assert len(calls) == 2, "the first verify pass must be the one refused"


@pytest.mark.parametrize("requests", [1, 3])
def test_verify_profiles_cover_the_batch_and_roll_every_pass_back(requests, monkeypatch):
    target = tiny_target()
    fed, states = [], []
    forward = target.forward

    def spy(state, input_ids, positions, valid):
        fed.append((tuple(input_ids.shape), int(valid.sum()), bool(valid[:, 0].all())))
        states.append(state)
        return forward(state, input_ids, positions, valid)

    monkeypatch.setattr(target, "forward", spy)
    sps = profile_verify_sps(target, 7, requests=requests, context=5, repeats=1)
    assert sps.max_tokens == 7
    assert bool((sps.sps[1:] > 0).all())
    passes = fed[1:]  # after the prefill: a round of warm-up passes, then a round of timed ones, a pass per count
    assert [valid for _, valid, _ in passes] == list(range(requests, 8)) * 2
    for shape, valid, anchors in passes:
        assert shape == (requests, -(-valid // requests)) and anchors, (shape, valid)
    assert states[-1].valid.sum(1).tolist() == [5] * requests  # only the context is left valid


TRANSPOSED, F_LINEAR = (SKINNY_ROWS, "transposed", 1), (0, "transposed", 1)
PACKED_2, PACKED_4 = (SKINNY_ROWS, "packed", 2), (SKINNY_ROWS, "packed", 4)


def _setting():
    return skinny_rows(), skinny_layout(), skinny_min_rows()


CANDIDATES = [
    (1, True, [TRANSPOSED, F_LINEAR, PACKED_2, PACKED_4, PACKED_4, PACKED_2, F_LINEAR, TRANSPOSED]),
    (4, True, [TRANSPOSED, F_LINEAR, PACKED_2, PACKED_2, F_LINEAR, TRANSPOSED]),  # every request feeds ≥ 4 rows
    (1, False, [TRANSPOSED, F_LINEAR, F_LINEAR, TRANSPOSED]),
]


@pytest.mark.parametrize("requests, mkl, expected_order, faster", [
    (requests, mkl, order, faster) for requests, mkl, order in CANDIDATES for faster in dict.fromkeys(order)])
def test_choose_few_row_layout_keeps_the_fastest_layout_and_its_table(requests, mkl, expected_order, faster,
                                                                     monkeypatch):
    latencies = [0.10, 0.12, 0.13, 0.20]  # a pass of B = 1 … 4 tokens in the fastest layout
    profiled = []

    def profile(target, max_tokens, *, requests, context, repeats):
        profiled.append(_setting())
        slower = 1.0 if _setting() == faster else 1.5
        return SPSTable.from_latencies(range(1, max_tokens + 1), [slower * s for s in latencies])

    monkeypatch.setattr(dspark.runtime.profiling, "profile_verify_sps", profile)
    monkeypatch.setattr(dspark.linear, "packed_layout_available", lambda dtype=torch.float32: mkl)
    before = _setting()
    with few_row_layout(5):
        table = choose_few_row_layout(tiny_target(), 4, requests=requests)
        assert _setting() == faster
    assert profiled == expected_order  # reads the same backwards, so drift weighs on every layout alike
    assert _setting() == before
    assert_close_float64(1.0 / table.sps[1:], torch.tensor(latencies, dtype=torch.float64), name="kept table")


def test_choose_few_row_layout_profiles_a_real_target():
    with few_row_layout(SKINNY_ROWS):
        table = choose_few_row_layout(tiny_target(), 3, requests=2, context=5, repeats=1)
        assert _setting() in (TRANSPOSED, F_LINEAR, PACKED_2, PACKED_4)
        # Copies of the weights packed while profiling stay only if the packed layout was kept.
        assert (len(dspark.linear._packed) > 0) == (skinny_layout() == "packed")
    assert table.max_tokens == 3
    assert bool((table.sps[1:] > 0).all())


def test_verify_profiles_refuse_more_requests_than_tokens():
    with pytest.raises(ValueError, match="requests must lie"):
        profile_verify_sps(tiny_target(), 2, requests=3)
