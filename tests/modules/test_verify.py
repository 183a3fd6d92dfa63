import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from dspark.contract import ACCEPTED, NOT_REACHED, REJECTED
from dspark.markov import sample_block
from dspark.sampling import warp_logits
from dspark.testing import assert_equal, chi_square_pvalue, random_markov_weights
from dspark.verify import verify, verify_greedy
from tests.strategies import verify_inputs


@given(inputs=verify_inputs())
def test_verify_matches_reference(inputs):
    got = verify(**inputs, backend="torch")
    want = verify(**inputs, backend="reference")
    for name in ("num_accepted", "outcome", "next_token", "committed", "num_committed", "finished"):
        assert_equal(getattr(got, name), getattr(want, name), name=name)
    slots = torch.arange(inputs["draft_tokens"].shape[1])
    assert bool(((got.outcome != NOT_REACHED) <= (slots < inputs["verify_len"][:, None])).all())


def test_outcomes_eos_and_bonus_by_hand():
    # Two tokens, V = 3. Request 0 accepts both and takes a bonus; request 1 rejects slot 2;
    # request 2 accepts an EOS at slot 1 and stops; request 3 verifies nothing and takes the bonus.
    q = torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64).expand(4, 2, 3)
    p = torch.tensor([[0.0, 1.0, 0.0]], dtype=torch.float64).expand(4, 3, 3)
    tokens = torch.tensor([[1, 1], [1, 0], [2, 1], [0, 0]])
    p = p.clone()
    p[2, 0] = torch.tensor([0.0, 0.0, 1.0])
    out = verify(tokens, q, p, torch.tensor([2, 2, 2, 0]), torch.full((4, 2), 0.5, dtype=torch.float64),
                 torch.full((4,), 0.5, dtype=torch.float64), eos_token_id=2)
    assert out.num_accepted.tolist() == [2, 1, 1, 0]
    assert out.outcome.tolist() == [[ACCEPTED, ACCEPTED], [ACCEPTED, REJECTED], [ACCEPTED, NOT_REACHED],
                                    [NOT_REACHED, NOT_REACHED]]
    assert out.committed.tolist() == [[1, 1, 1], [1, 1, -1], [2, -1, -1], [1, -1, -1]]
    assert out.num_committed.tolist() == [3, 2, 1, 1]
    assert out.finished.tolist() == [False, False, True, False]


def test_empty_residual_falls_back_to_target():
    """p and q differ by rounding noise: a rejection draws from p, not from the 1e-9 residual."""
    p = torch.tensor([[[0.5, 0.5], [0.5, 0.5]]], dtype=torch.float64)
    q = torch.tensor([[[0.5 + 1e-9, 0.5 - 1e-9]]], dtype=torch.float64)
    out = verify(torch.tensor([[0]]), q, p, torch.tensor([1]), torch.tensor([[1 - 1e-12]], dtype=torch.float64),
                 torch.tensor([0.1], dtype=torch.float64))
    assert out.outcome.tolist() == [[REJECTED]] and out.next_token.tolist() == [0]


# --- Losslessness ------------------------------------------------------------------------------------
# A bigram toy target p_t(· | prev) and a Markov-biased block drafter whose base logits depend on the
# anchor. Each of N independent streams decodes from the same anchor until it has two tokens, with a
# verify length drawn per round at random in [0, γ] (ragged, independent of the draft). The joint law of
# the first two tokens must be p_t(t1 | x0) · p_t(t2 | t1): Pearson chi-square over V² = 36 cells at
# α = 1e-3. With N = 200,000 a shift of 0.01 in a cell of probability 0.1 adds a noncentrality of
# about N · 0.01² / 0.1 = 200 to a 35-dof statistic whose α-critical value is 66.6, so it fails with
# power well above 0.99. Seeds are fixed: the outcome is deterministic.
VOCAB, GAMMA, ANCHOR, SAMPLES, ALPHA = 6, 3, 2, 200_000, 1e-3


def _toy_models():
    gen = torch.Generator().manual_seed(1234)
    target_logits = torch.randn(VOCAB, VOCAB, generator=gen, dtype=torch.float64) * 1.5
    draft_base = torch.randn(VOCAB, GAMMA, VOCAB, generator=gen, dtype=torch.float64)
    weights = random_markov_weights("vanilla", VOCAB, VOCAB, 3, 4, seed=99)
    return target_logits, draft_base, weights


def _decode_two_tokens(temperature, top_k, *, argmax_draft=False, seed=0):
    target_logits, draft_base, weights = _toy_models()
    gen = torch.Generator().manual_seed(seed)
    target_table = warp_logits(target_logits, temperature, top_k)  # p_t(· | prev) as the user samples it
    out = torch.full((SAMPLES, 2), -1, dtype=torch.long)
    filled = torch.zeros(SAMPLES, dtype=torch.long)
    anchor = torch.full((SAMPLES,), ANCHOR, dtype=torch.long)
    while bool((filled < 2).any()):
        active = (filled < 2).nonzero().squeeze(1)
        n = active.numel()
        a = anchor[active]
        uniforms = torch.rand(n, GAMMA, generator=gen, dtype=torch.float64)
        hidden = torch.zeros(n, GAMMA, 4, dtype=torch.float64)
        tokens, draft_probs = sample_block(draft_base[a], hidden, a, uniforms, weights,
                                           temperature=temperature, top_k=top_k)
        if argmax_draft:  # the deliberately wrong variant: propose argmax, verify against softmax
            tokens = draft_probs.argmax(-1)
        context = torch.cat([a[:, None], tokens], 1)
        target_probs = target_table[context]
        result = verify(tokens, draft_probs, target_probs, torch.randint(0, GAMMA + 1, (n,), generator=gen),
                        torch.rand(n, GAMMA, generator=gen, dtype=torch.float64),
                        torch.rand(n, generator=gen, dtype=torch.float64))
        for i in range(2):
            take = (filled[active] <= i) & (result.num_committed > i - filled[active])
            src = (i - filled[active]).clamp(min=0)
            rows = active[take]
            out[rows, i] = result.committed[take, src[take]]
        filled[active] = filled[active] + result.num_committed
        anchor[active] = result.next_token
    return out, target_table


def _joint_pvalue(out, target_table):
    counts = torch.bincount(out[:, 0] * VOCAB + out[:, 1], minlength=VOCAB * VOCAB)
    expected = target_table[ANCHOR][:, None] * target_table
    return chi_square_pvalue(counts, expected)


@pytest.mark.parametrize("temperature, top_k", [(1.0, None), (0.7, 4)], ids=["T=1", "T=0.7,top-k=4"])
def test_joint_distribution_of_first_two_tokens_is_the_targets(temperature, top_k):
    out, table = _decode_two_tokens(temperature, top_k)
    p = _joint_pvalue(out, table)
    assert p > ALPHA, f"speculative output differs from the target (chi-square p = {p:.2e})"


def test_argmax_draft_with_ratio_verification_is_detected():
    """The test can fail: drafting argmax while verifying with p/q against softmax is not lossless."""
    out, table = _decode_two_tokens(1.0, None, argmax_draft=True)
    p = _joint_pvalue(out, table)
    assert p < ALPHA, f"the lossy variant went undetected (chi-square p = {p:.2e})"


def test_greedy_always_equals_target_argmax():
    out, table = _decode_two_tokens(0.0, None)
    first = table[ANCHOR].argmax()
    assert bool((out[:, 0] == first).all()) and bool((out[:, 1] == table[first].argmax()).all())


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda a: a.update(verify_len=torch.tensor([3])), "verify_len"),
        (lambda a: a.update(target_probs=torch.full((1, 3, 4), 0.25)), "vocabulary mismatch"),
        (lambda a: a.update(draft_tokens=torch.tensor([[0, 5]])), "draft_tokens"),
        (lambda a: a.update(final_uniforms=torch.tensor([1.5])), "uniform"),
        (lambda a: a.update(draft_probs=torch.full((1, 2, 3), float("nan"))), "NaN"),
        (lambda a: a.update(target_probs=torch.full((1, 2, 3), 0.3)), "target_probs"),
    ],
)
def test_bad_verify_input_raises(mutate, message):
    args = dict(draft_tokens=torch.tensor([[0, 1]]), draft_probs=torch.full((1, 2, 3), 1 / 3),
                target_probs=torch.full((1, 3, 3), 1 / 3), verify_len=torch.tensor([2]),
                accept_uniforms=torch.rand(1, 2), final_uniforms=torch.rand(1))
    mutate(args)
    with pytest.raises(ValueError, match=message):
        verify(**args)


def test_sample_size_detects_a_one_point_bias():
    """The power claim above, checked: 0.01 of mass moved between two cells of the true joint fails."""
    target_logits, _, _ = _toy_models()
    table = warp_logits(target_logits, 1.0)
    expected = (table[ANCHOR][:, None] * table).flatten()
    biased = expected.clone()
    donor = int(expected.argmax())
    receiver = int((expected - 0.1).abs().argmin())
    biased[donor] -= 0.01
    biased[receiver] += 0.01
    gen = torch.Generator().manual_seed(5)
    def draw(probs):
        samples = torch.multinomial(probs, SAMPLES, replacement=True, generator=gen)
        return torch.bincount(samples, minlength=probs.numel())

    assert chi_square_pvalue(draw(biased), expected) < ALPHA
    assert chi_square_pvalue(draw(expected), expected) > ALPHA


@pytest.mark.parametrize("backend", ["reference", "torch"])
def test_rows_that_are_not_distributions_are_refused(backend):
    gen = torch.Generator().manual_seed(0)
    draft_probs = torch.softmax(torch.randn(2, 3, 10, generator=gen), -1)
    target_probs = torch.softmax(torch.randn(2, 4, 10, generator=gen), -1)
    tokens = torch.randint(0, 10, (2, 3), generator=gen)
    verify_len = torch.tensor([3, 1])
    u, final = torch.rand(2, 3, generator=gen), torch.rand(2, generator=gen)
    for bad, name in ((torch.zeros_like(target_probs), "target_probs"), (target_probs * 7, "target_probs")):
        with pytest.raises(ValueError, match=f"{name}.*not 1"):
            verify(tokens, draft_probs, bad, verify_len, u, final, backend=backend)
    with pytest.raises(ValueError, match="draft_probs.*not 1"):
        verify(tokens, draft_probs * 2, target_probs, verify_len, u, final, backend=backend)
    unread = target_probs.clone()
    unread[1, 3] = 0  # request 1 verifies one draft: its rows 2 and 3 are never read
    verify(tokens, draft_probs, unread, verify_len, u, final, backend=backend)
    with pytest.raises(ValueError, match="eos_token_id"):
        verify(tokens, draft_probs, target_probs, verify_len, u, final, eos_token_id=10, backend=backend)


@given(
    requests=st.integers(1, 5),
    gamma=st.integers(1, 6),
    vocab=st.integers(2, 9),
    eos=st.one_of(st.none(), st.integers(0, 1)),
    seed=st.integers(0, 2**31),
)
def test_verify_greedy_equals_verify_on_one_hot_distributions(requests, gamma, vocab, eos, seed):
    """Small vocabularies and drafts that mostly match the target make long accepted prefixes, an EOS (token 0 or
    1) and ℓ = 0 common; integer logits make exact ties, which both paths must break at the first argmax."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randint(0, 3, (requests, gamma + 1, vocab), generator=gen).double()
    target_tokens = logits.argmax(-1)
    matching = torch.rand(requests, gamma, generator=gen) < 0.7
    draft_tokens = torch.where(matching, target_tokens[:, :gamma], torch.randint(0, vocab, (requests, gamma),
                                                                                     generator=gen))
    verify_len = torch.randint(0, gamma + 1, (requests,), generator=gen)
    got = verify_greedy(draft_tokens, target_tokens, verify_len, eos_token_id=eos)
    want = verify(draft_tokens, torch.nn.functional.one_hot(draft_tokens, vocab).double(), warp_logits(logits, 0.0),
                  verify_len, torch.rand(requests, gamma, generator=gen, dtype=torch.float64),
                  torch.rand(requests, generator=gen, dtype=torch.float64), eos_token_id=eos, backend="reference")
    for name in ("num_accepted", "outcome", "next_token", "committed", "num_committed", "finished"):
        assert_equal(getattr(got, name), getattr(want, name), name=name)


@pytest.mark.parametrize("mutate, message", [
    (lambda d, t, n: (d, t[:, :-1], n), "target_tokens must have shape"),
    (lambda d, t, n: (d.float(), t, n), "integer"),
    (lambda d, t, n: (d, t, n + 3), "verify_len must lie in"),
    (lambda d, t, n: (d - 5, t, n), "non-negative"),
])
def test_bad_verify_greedy_input_raises(mutate, message):
    draft, target, lengths = torch.tensor([[1, 2]]), torch.tensor([[1, 2, 3]]), torch.tensor([2])
    with pytest.raises(ValueError, match=message):
        verify_greedy(*mutate(draft, target, lengths))
