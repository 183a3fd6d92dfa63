"""The regenerated corpus: each answer is the target's greedy answer to its prompt alone, the captured
features are the target's full-forward features of the answered sequence, and a rerun resumes."""

import pytest
import torch

from dspark.runtime.decoding import SamplingConfig, generate
from dspark.train.corpus import answer_batch, build_corpus, load_corpus
from dspark.train.features import OfflineFeatures, target_features
from tests.e2e.conftest import tiny_target


def _prompts(target, count=7, seed=0):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, 12, (count,), generator=gen).tolist()  # ragged: padding inside the batches
    return [torch.randint(0, target.vocab_size, (n,), generator=gen).tolist() for n in lengths]


def test_corpus_holds_each_prompts_own_answer_and_full_forward_features(tmp_path):
    target = tiny_target(vocab=48)
    prompts = _prompts(target)
    report = build_corpus(target, prompts, tmp_path, max_new_tokens=9, batch_size=3, round_size=5,
                          dtype=torch.float32, min_active_fraction=0.0, progress=False)
    assert report.samples_written == len(prompts) and report.samples_total == len(prompts)
    samples = load_corpus(tmp_path)
    assert [s.key for s in samples] == list(range(len(prompts)))
    source = OfflineFeatures(tmp_path, target.tap_layers, target.hidden_size)
    for sample, prompt in zip(samples, prompts):
        alone = generate(target, [prompt], SamplingConfig(max_new_tokens=9)).tokens[0]
        assert sample.token_ids.tolist() == prompt + alone
        assert sample.loss_mask.tolist() == [False] * len(prompt) + [True] * len(alone)
        # Batched with padding and a cache versus one full forward: fp32 rounding only.
        for got, want in zip(source.features(sample.key, sample), target_features(target, sample.token_ids)):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_corpus_resumes_and_refuses_other_settings(tmp_path):
    target = tiny_target(vocab=48)
    prompts = _prompts(target, count=5)
    build_corpus(target, prompts, tmp_path, max_new_tokens=6, batch_size=2, progress=False)
    kept = (tmp_path / "000000.safetensors").stat().st_mtime_ns
    (tmp_path / "000003.safetensors").unlink()
    again = build_corpus(target, prompts, tmp_path, max_new_tokens=6, batch_size=2, progress=False)
    assert again.samples_written == 1 and again.samples_total == 5
    assert (tmp_path / "000000.safetensors").stat().st_mtime_ns == kept
    with pytest.raises(ValueError, match="other settings"):
        build_corpus(target, prompts, tmp_path, max_new_tokens=7, progress=False)
    with pytest.raises(ValueError, match="other settings"):
        build_corpus(target, prompts[:4], tmp_path, max_new_tokens=6, progress=False)
    with pytest.raises(ValueError, match="token-id prompt"):
        build_corpus(target, [[1, 2, 999]], tmp_path / "other", progress=False)


def test_an_interrupted_run_keeps_its_record(tmp_path, monkeypatch):
    """The manifest's run entry is written after every batch, so tokens and time of a run stopped midway
    (the corpus then resumes) still count in the regeneration record."""
    import json

    import dspark.train.corpus as corpus

    target = tiny_target(vocab=48)
    prompts = _prompts(target, count=5)
    real, calls = corpus.answer_batch, []

    def stopped_after_one_batch(*args, **kwargs):
        if calls:
            raise KeyboardInterrupt
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(corpus, "answer_batch", stopped_after_one_batch)
    with pytest.raises(KeyboardInterrupt):
        build_corpus(target, prompts, tmp_path, max_new_tokens=6, batch_size=2, progress=False)
    runs = json.loads((tmp_path / "corpus.json").read_text())["runs"]
    written = load_corpus(tmp_path)
    assert len(runs) == 1 and runs[0]["samples_written"] == len(written) == 2
    assert runs[0]["answer_tokens"] == sum(int(s.loss_mask.sum()) for s in written)
    monkeypatch.setattr(corpus, "answer_batch", real)
    build_corpus(target, prompts, tmp_path, max_new_tokens=6, batch_size=2, progress=False)
    runs = json.loads((tmp_path / "corpus.json").read_text())["runs"]
    assert [r["samples_written"] for r in runs] == [2, 3]


def test_answers_cut_when_the_batch_empties_are_prefixes_of_the_full_answers():
    target = tiny_target(vocab=48)
    prompts = _prompts(target, count=4)
    first = answer_batch(target, prompts, max_new_tokens=12)[0][0]
    target.model.config.eos_token_id = first[2]  # request 0 now stops at its third token; the others may not
    full = answer_batch(target, prompts, max_new_tokens=12, min_active_fraction=0.0)
    cut = answer_batch(target, prompts, max_new_tokens=12, min_active_fraction=1.0)
    assert len(full[0][0]) == 3 and any(len(a) > len(b) for (a, _, _), (b, _, _) in zip(full, cut))
    for (a, taps_a, _), (b, taps_b, _), prompt in zip(full, cut, prompts):
        assert 1 <= len(b) <= len(a) and a[: len(b)] == b
        assert taps_b.shape[0] == len(prompt) + len(b)  # every token read, the last one included
        torch.testing.assert_close(taps_a[: taps_b.shape[0]], taps_b, rtol=1e-4, atol=1e-4)


def test_a_sample_budget_keeps_a_prefix_of_the_shuffled_order(tmp_path):
    from dspark.train.corpus import corpus_order

    target = tiny_target(vocab=48)
    prompts = _prompts(target, count=6)
    report = build_corpus(target, prompts, tmp_path, max_new_tokens=4, batch_size=2, max_samples=4, progress=False)
    chosen = corpus_order(len(prompts))[:4]
    assert report.samples_total == 4 and sorted(s.key for s in load_corpus(tmp_path)) == sorted(chosen)
    assert [s.key for s in load_corpus(tmp_path, chosen[:2])] == sorted(chosen[:2])
    with pytest.raises(ValueError, match="lacks"):
        load_corpus(tmp_path, corpus_order(len(prompts)))
    assert build_corpus(target, prompts, tmp_path, max_new_tokens=4, max_samples=6, progress=False).samples_written == 2


def test_features_equal_the_cached_forward_on_every_valid_slot():
    target = tiny_target(vocab=48)
    prompts = _prompts(target, count=4)
    from dspark.runtime.decoding import prefill

    _, _, step, lengths, ids = prefill(target, prompts)
    valid = torch.arange(ids.shape[1])[None] < lengths[:, None]
    taps, hidden = target.features(ids, valid)
    for b, n in enumerate(lengths.tolist()):
        torch.testing.assert_close(taps[b, :n], step.taps[b, :n], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(hidden[b, :n], step.hidden[b, :n], rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="shape"):
        target.features(ids, valid[:, :-1])


def test_a_corpus_rebuilt_from_its_answers_equals_the_answered_one(tmp_path):
    """Token ids, masks and manifest come back exactly; the features come from one forward over each whole
    sequence instead of a prefill and decode steps, so they agree to fp32 rounding (the tolerance of the
    first test)."""
    import json

    from dspark.train.answers import load_answers, rebuild_corpus, save_answers

    target = tiny_target(vocab=48)
    prompts = _prompts(target, count=7)
    build_corpus(target, prompts, tmp_path / "answered", max_new_tokens=9, batch_size=3, dtype=torch.float32,
                 progress=False)
    archive = save_answers(tmp_path / "answered", tmp_path / "answers.npz")
    stored = load_answers(archive)
    assert sorted(stored.keys) == list(range(7))
    report = rebuild_corpus(target, prompts, archive, tmp_path / "rebuilt", max_new_tokens=9, keys=[0, 1, 2, 5],
                            batch_size=2, dtype=torch.float32, progress=False)
    assert report.samples_written == 4
    assert rebuild_corpus(target, prompts, archive, tmp_path / "rebuilt", max_new_tokens=9, batch_size=2,
                          dtype=torch.float32, progress=False).samples_written == 3  # resumes: the first four are kept
    answered, rebuilt = load_corpus(tmp_path / "answered"), load_corpus(tmp_path / "rebuilt")
    assert report.answer_tokens == sum(int(s.loss_mask.sum()) for s in answered if s.key in (0, 1, 2, 5))
    assert stored.answer_tokens == sum(int(s.loss_mask.sum()) for s in answered)
    features = [OfflineFeatures(tmp_path / d, target.tap_layers, target.hidden_size) for d in ("answered", "rebuilt")]
    for a, b in zip(answered, rebuilt):
        assert a.key == b.key and torch.equal(a.token_ids, b.token_ids) and torch.equal(a.loss_mask, b.loss_mask)
        for got, want in zip(features[1].features(b.key, b), features[0].features(a.key, a)):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    manifests = [json.loads((tmp_path / d / "corpus.json").read_text()) for d in ("answered", "rebuilt")]
    assert manifests[1]["settings"] == manifests[0]["settings"] and manifests[1]["runs"] == manifests[0]["runs"]
    assert [r["samples_written"] for r in manifests[1]["rebuilds"]] == [4, 3]
    # The rebuilt corpus is build_corpus's own: answering again finds nothing left to do.
    assert build_corpus(target, prompts, tmp_path / "rebuilt", max_new_tokens=9, dtype=torch.float32,
                        progress=False).samples_written == 0


def test_a_rebuild_may_take_features_from_the_target_in_another_dtype(tmp_path):
    """Answers of the fp64 target, features of the same target in fp32 (as bf16 answers get fp32 features on
    a CPU that emulates bf16): the tokens come back exactly, the manifest names both dtypes, and the
    features agree to fp32 rounding (the tolerance of the first test)."""
    import json

    from dspark.train.answers import rebuild_corpus, save_answers

    answering = tiny_target(vocab=48)
    answering.model.to(torch.float64)
    prompts = _prompts(answering, count=4)
    build_corpus(answering, prompts, tmp_path / "answered", max_new_tokens=6, batch_size=2, dtype=torch.float32,
                 progress=False)
    archive = save_answers(tmp_path / "answered", tmp_path / "answers.npz")
    featuring = tiny_target(vocab=48)
    for a, b in zip(answering.model.parameters(), featuring.model.parameters()):
        assert torch.equal(a.float(), b)  # the same seeded weights: only the dtype differs
    rebuild_corpus(featuring, prompts, archive, tmp_path / "rebuilt", max_new_tokens=6, dtype=torch.float32,
                   progress=False)
    settings = [json.loads((tmp_path / d / "corpus.json").read_text())["settings"] for d in ("answered", "rebuilt")]
    assert settings[1] == {**settings[0], "features_target_dtype": "torch.float32"}
    assert settings[0]["target_dtype"] == "torch.float64"
    sources = [OfflineFeatures(tmp_path / d, answering.tap_layers, answering.hidden_size)
               for d in ("answered", "rebuilt")]
    for a, b in zip(load_corpus(tmp_path / "answered"), load_corpus(tmp_path / "rebuilt")):
        assert torch.equal(a.token_ids, b.token_ids) and torch.equal(a.loss_mask, b.loss_mask)
        for got, want in zip(sources[1].features(b.key, b), sources[0].features(a.key, a)):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_a_rebuild_refuses_other_prompts_or_a_damaged_archive(tmp_path):
    import numpy as np

    from dspark.train.answers import load_answers, rebuild_corpus, save_answers

    target = tiny_target(vocab=48)
    prompts = _prompts(target, count=4)
    build_corpus(target, prompts, tmp_path / "answered", max_new_tokens=5, batch_size=2, progress=False)
    archive = save_answers(tmp_path / "answered", tmp_path / "answers.npz")
    with pytest.raises(ValueError, match="other settings"):
        rebuild_corpus(target, prompts[:3], archive, tmp_path / "a", max_new_tokens=5, progress=False)
    with pytest.raises(ValueError, match="other settings"):
        rebuild_corpus(target, prompts, archive, tmp_path / "b", max_new_tokens=5, dtype=torch.float32,
                       progress=False)
    with pytest.raises(ValueError, match=r"other settings \(differing: \['max_new_tokens'\]\)"):
        rebuild_corpus(target, prompts, archive, tmp_path / "b", max_new_tokens=6, progress=False)
    with np.load(archive, allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files}
    arrays["token_ids"] = arrays["token_ids"].copy()
    arrays["token_ids"][0] = (int(arrays["token_ids"][0]) + 1) % target.vocab_size  # the first prompt's first token
    np.savez_compressed(tmp_path / "tampered.npz", **arrays)
    with pytest.raises(ValueError, match="encodes differently"):
        rebuild_corpus(target, prompts, tmp_path / "tampered.npz", tmp_path / "c", max_new_tokens=5, progress=False)
    np.savez_compressed(tmp_path / "short.npz", **{**arrays, "offsets": arrays["offsets"][:-1]})
    with pytest.raises(ValueError, match="disagree"):
        load_answers(tmp_path / "short.npz")
    np.savez_compressed(tmp_path / "other.npz", keys=arrays["keys"])
    with pytest.raises(ValueError, match="not an answers archive"):
        load_answers(tmp_path / "other.npz")
    with pytest.raises(ValueError, match="no answers archive"):
        load_answers(tmp_path / "missing.npz")
    with pytest.raises(ValueError, match="no corpus"):
        save_answers(tmp_path / "nowhere", tmp_path / "x.npz")


def test_sampled_answers_follow_the_tempered_distribution():
    """The first answer token of 4,000 copies of one prompt, each with its own seed, against softmax(l / T) of the
    prompt's logits. With 48 tokens and 4,000 draws the total-variation distance of an exact sampler is about
    0.02 (the sum over tokens of sqrt(p(1 − p) / 2πN)); 0.06 allows three times that, while the distributions of
    sampling at T = 1 instead of 0.5, or of taking the argmax, lie 0.24 and 0.69 away (asserted beyond 0.15, so the
    check can fail)."""
    from dspark.runtime.decoding import prefill
    from dspark.train.corpus import sampling_seed

    target = tiny_target(vocab=48)
    with torch.no_grad():
        target.model.lm_head.weight.mul_(3)  # spread the logits so that the temperature matters
    prompt = _prompts(target, count=1)[0]
    logits = prefill(target, [prompt])[1][0]
    draws = 4000
    answers = answer_batch(target, [prompt] * draws, max_new_tokens=1, temperature=0.5,
                           seeds=[sampling_seed(0, i) for i in range(draws)])
    counts = torch.bincount(torch.tensor([a[0][0] for a in answers]), minlength=48).double() / draws

    def distance(p: torch.Tensor) -> float:
        return 0.5 * float((counts - p).abs().sum())

    assert distance(torch.softmax(logits.double() / 0.5, -1)) < 0.06
    assert distance(torch.softmax(logits.double(), -1)) > 0.15
    assert distance(torch.nn.functional.one_hot(logits.argmax(), 48).double()) > 0.15


def test_a_sampled_answer_depends_on_its_seed_not_its_batch():
    from dspark.train.corpus import sampling_seed

    target = tiny_target(vocab=48)
    prompts = _prompts(target, count=5)
    seeds = [sampling_seed(3, i) for i in range(5)]
    batched = [a for a, _, _ in answer_batch(target, prompts, max_new_tokens=10, temperature=1.0, seeds=seeds,
                                             min_active_fraction=0.0)]
    alone = [answer_batch(target, [p], max_new_tokens=10, temperature=1.0, seeds=[s])[0][0]
             for p, s in zip(prompts, seeds)]
    assert batched == alone  # fp32: a batch changes no logit enough to move a draw
    greedy = [a for a, _, _ in answer_batch(target, prompts, max_new_tokens=10, min_active_fraction=0.0)]
    assert batched != greedy
    reseeded = [a for a, _, _ in answer_batch(target, prompts, max_new_tokens=10, temperature=1.0,
                                              seeds=[sampling_seed(4, i) for i in range(5)], min_active_fraction=0.0)]
    assert batched != reseeded
    with pytest.raises(ValueError, match="one seed per prompt"):
        answer_batch(target, prompts, max_new_tokens=4, temperature=1.0, seeds=seeds[:4])
    with pytest.raises(ValueError, match="temperature must be"):
        answer_batch(target, prompts, max_new_tokens=4, temperature=-1.0, seeds=seeds)


def test_a_sampled_corpus_records_its_temperature_and_rebuilds_from_its_answers(tmp_path):
    """A greedy corpus records no temperature (its settings are those of corpora answered before sampling existed);
    a sampled one does, so neither continues the other, and its archive rebuilds only with the same temperature."""
    import json

    from dspark.train.answers import rebuild_corpus, save_answers
    from dspark.train.corpus import sampling_seed

    target = tiny_target(vocab=48)
    prompts = _prompts(target, count=5)
    build_corpus(target, prompts, tmp_path / "greedy", max_new_tokens=6, batch_size=2, progress=False)
    build_corpus(target, prompts, tmp_path / "sampled", max_new_tokens=6, batch_size=2, temperature=0.8, seed=2,
                 dtype=torch.float32, progress=False)
    settings = {d: json.loads((tmp_path / d / "corpus.json").read_text())["settings"] for d in ("greedy", "sampled")}
    assert "temperature" not in settings["greedy"] and settings["sampled"]["temperature"] == 0.8
    for sample, prompt in zip(load_corpus(tmp_path / "sampled"), prompts):
        alone = answer_batch(target, [prompt], max_new_tokens=6, temperature=0.8,
                             seeds=[sampling_seed(2, sample.key)])[0][0]
        assert sample.token_ids.tolist() == prompt + alone
    with pytest.raises(ValueError, match="other settings"):
        build_corpus(target, prompts, tmp_path / "greedy", max_new_tokens=6, temperature=0.8, progress=False)
    with pytest.raises(ValueError, match="other settings"):
        build_corpus(target, prompts, tmp_path / "sampled", max_new_tokens=6, seed=2, dtype=torch.float32,
                     progress=False)
    with pytest.raises(ValueError, match="temperature must be"):
        build_corpus(target, prompts, tmp_path / "bad", temperature=float("nan"), progress=False)
    archive = save_answers(tmp_path / "sampled", tmp_path / "sampled.npz")
    with pytest.raises(ValueError, match=r"differing: \['temperature'\]"):
        rebuild_corpus(target, prompts, archive, tmp_path / "rebuilt", max_new_tokens=6, seed=2, dtype=torch.float32,
                       progress=False)
    rebuild_corpus(target, prompts, archive, tmp_path / "rebuilt", max_new_tokens=6, seed=2, temperature=0.8,
                   dtype=torch.float32, progress=False)
    assert [s.token_ids.tolist() for s in load_corpus(tmp_path / "rebuilt")] == \
        [s.token_ids.tolist() for s in load_corpus(tmp_path / "sampled")]


def test_an_archive_grows_by_answering_only_the_prompts_it_lacks(tmp_path):
    """Grown in a fresh directory (as on another machine), the archive's answers are kept without answering them
    again or rebuilding their features, the new prompts are answered, and the grown archive holds what answering
    all of them at once gives; a training run on that directory then rebuilds only the features it lacks."""
    import json

    from dspark.train.answers import answered_corpus, grow_answers
    from dspark.train.corpus import corpus_order, sample_path

    target = tiny_target(vocab=48)
    prompts = _prompts(target, count=7)
    archive = tmp_path / "pool.answers.npz"
    first = grow_answers(target, prompts, 3, archive, tmp_path / "first", max_new_tokens=9, progress=False)
    assert first.keys == sorted(corpus_order(7)[:3])
    grown = grow_answers(target, prompts, 6, archive, tmp_path / "second", max_new_tokens=9, progress=False)
    assert grown.keys == sorted(corpus_order(7)[:6])
    manifest = json.loads((tmp_path / "second" / "corpus.json").read_text())
    assert "rebuilds" not in manifest
    assert [r["samples_written"] for r in manifest["runs"]] == [3, 3]
    on_disk = [key for key in grown.keys if sample_path(tmp_path / "second", key).exists()]
    assert on_disk == sorted(set(grown.keys) - set(first.keys))
    assert grown.manifest["runs"] == manifest["runs"]
    at_once = grow_answers(target, prompts, 6, tmp_path / "at_once.npz", tmp_path / "at_once", max_new_tokens=9,
                           progress=False)
    assert at_once.keys == grown.keys and at_once.answer_starts == grown.answer_starts
    assert all(torch.equal(a, b) for a, b in zip(at_once.sequences, grown.sequences))
    for old, seq in zip(first.keys, first.sequences):
        assert torch.equal(grown.sequences[grown.keys.index(old)], seq)
    # Growing to the same size does nothing new; shrinking would drop answers, and out-of-range sizes are refused.
    again = grow_answers(target, prompts, 6, archive, tmp_path / "second", max_new_tokens=9, progress=False)
    assert again.manifest == grown.manifest and again.answer_tokens == grown.answer_tokens
    with pytest.raises(ValueError, match="beyond the first 5"):
        grow_answers(target, prompts, 5, archive, tmp_path / "second", max_new_tokens=9, progress=False)
    for count in (0, 8):
        with pytest.raises(ValueError, match="between 1 and the 7 prompts"):
            grow_answers(target, prompts, count, archive, tmp_path / "second", max_new_tokens=9, progress=False)
    # Answers under another budget would be another corpus.
    with pytest.raises(ValueError, match=r"other settings \(differing: \['max_new_tokens'\]\)"):
        grow_answers(target, prompts, 7, archive, tmp_path / "third", max_new_tokens=8, progress=False)
    answered_corpus(target, prompts, tmp_path / "second", 6, archive, max_new_tokens=9, progress=False)
    manifest = json.loads((tmp_path / "second" / "corpus.json").read_text())
    assert [r["samples_written"] for r in manifest["rebuilds"]] == [3]
    assert [r["samples_written"] for r in manifest["runs"]] == [3, 3]
    assert [s.token_ids.tolist() for s in load_corpus(tmp_path / "second")] == [s.tolist() for s in grown.sequences]


def test_lazy_features_are_computed_when_first_read_and_equal_a_rebuilds(tmp_path):
    """With ``lazy_features`` the archive's answers come back without features and only the prompts it lacks are
    answered; :class:`OfflineFeatures` given the target computes a sample's features when first read, stores them
    and reads what a rebuild writes, to bf16 rounding (one forward per sequence instead of a padded batch, both
    stored in bf16: the fp32 difference can tip a value to the neighbouring bf16, at most 2⁻⁷ of it)."""
    import json

    from dspark.train.answers import answered_corpus, grow_answers
    from dspark.train.corpus import corpus_order

    target = tiny_target(vocab=48)
    prompts = _prompts(target, count=7)
    archive = tmp_path / "pool.answers.npz"
    held = grow_answers(target, prompts, 5, archive, tmp_path / "answered", max_new_tokens=9, progress=False)
    lazy = answered_corpus(target, prompts, tmp_path / "lazy", 6, archive, max_new_tokens=9, lazy_features=True,
                           progress=False)
    eager = answered_corpus(target, prompts, tmp_path / "eager", 6, archive, max_new_tokens=9, progress=False)
    assert [(s.key, s.token_ids.tolist(), s.loss_mask.tolist()) for s in lazy] == \
        [(s.key, s.token_ids.tolist(), s.loss_mask.tolist()) for s in eager]
    assert [s.key for s in lazy] == sorted(corpus_order(7)[:6])
    new = sorted(set(corpus_order(7)[:6]) - set(held.keys))
    assert sorted(int(p.stem) for p in (tmp_path / "lazy").glob("[0-9]*.safetensors")) == new
    manifest = json.loads((tmp_path / "lazy" / "corpus.json").read_text())
    assert "rebuilds" not in manifest and manifest["runs"][:-1] == held.manifest["runs"]
    assert manifest["runs"][-1]["samples_written"] == len(new)

    source = OfflineFeatures(tmp_path / "lazy", target.tap_layers, target.hidden_size, target=target)
    rebuilt = OfflineFeatures(tmp_path / "eager", target.tap_layers, target.hidden_size)
    for sample in lazy:
        for got, want in zip(source.features(sample.key, sample), rebuilt.features(sample.key, sample)):
            torch.testing.assert_close(got, want, rtol=2 ** -7, atol=1e-5)
    assert source.built == len(held.keys) and source.build_seconds > 0
    assert sorted(int(p.stem) for p in (tmp_path / "lazy").glob("[0-9]*.safetensors")) == [s.key for s in lazy]
    first = source.features(lazy[0].key, lazy[0])
    assert source.built == len(held.keys)  # stored: a second read computes nothing
    assert all(torch.equal(a, b) for a, b in zip(first, source.features(lazy[0].key, lazy[0])))
    # A step's samples in one padded forward (a repeated one computed once) read what one forward each gives.
    batched = OfflineFeatures(tmp_path / "batched", target.tap_layers, target.hidden_size, target=target)
    batched.prefetch([(s.key, s) for s in lazy] + [(lazy[0].key, lazy[0])])
    assert batched.built == len(lazy)
    for sample in lazy:
        for got, want in zip(batched.features(sample.key, sample), source.features(sample.key, sample)):
            torch.testing.assert_close(got, want, rtol=2 ** -7, atol=1e-5)
    assert batched.built == len(lazy)

    with pytest.raises(ValueError, match=r"differing: \['max_new_tokens'\]"):
        answered_corpus(target, prompts, tmp_path / "other", 6, archive, max_new_tokens=8, lazy_features=True,
                        progress=False)
    with pytest.raises(ValueError, match="the target taps layers"):
        OfflineFeatures(tmp_path / "lazy", [0], target.hidden_size, target=target)
