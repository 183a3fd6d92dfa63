"""Training: anchors and labels as method.md §3, bit-exact resume, 2 ranks == 1 rank, offline == online."""

import datetime
import json

import pytest
import torch

from dspark.runtime.machine import tune_cpu_allocator
from dspark.train.config import TrainConfig
from dspark.train.features import OfflineFeatures, write_offline_features
from dspark.train.pipeline import loss_weights_suffix
from dspark.train.samples import Sample, block_targets, sample_anchors
from dspark.train.trainer import Trainer, source_commit
from tests.e2e.training_helpers import RECIPE_ANSWERS, distributed_worker, tiny_trainer, toy_recipe


def test_anchors_are_answer_positions_followed_by_answer_tokens():
    mask = torch.tensor([0, 0, 1, 1, 1, 0, 1, 1, 1, 1], dtype=torch.bool)
    pos, valid = sample_anchors(mask, 10, torch.Generator().manual_seed(0))
    chosen = pos[valid].tolist()
    assert chosen == [2, 3, 6, 7, 8] and valid.sum() == 5  # all valid anchors, sorted; p=4 fails (mask[5]=0)
    pos, valid = sample_anchors(mask, 3, torch.Generator().manual_seed(0))
    assert valid.all() and len(set(pos.tolist())) == 3 and pos.tolist() == sorted(pos.tolist())


def test_block_targets_follow_the_sample_from_anchor_layout():
    ids = torch.arange(100, 110)
    mask = torch.tensor([0, 0, 1, 1, 1, 0, 1, 1, 1, 1], dtype=torch.bool)
    labels, eval_mask, next_ids, target_index = block_targets(ids, mask, torch.tensor([2, 7, 0]),
                                                              torch.tensor([True, True, False]), 4)
    assert labels[0].tolist() == [103, 104, 105, 106]  # slot k predicts x[a + k + 1]
    assert eval_mask[0].tolist() == [True, True, False, False]  # x[5] is outside the answer: prefix stops
    assert eval_mask[1].tolist() == [True, True, False, False]  # a + k + 1 reaches the end of the sequence
    assert not eval_mask[2].any()  # padding block
    assert next_ids[0].tolist() == [103, 104, 105]  # previous tokens of slots 2..γ are the ground truth
    assert target_index[0].tolist() == [2, 3, 4, 5]  # p_t of slot k is the target's output at a + k


@pytest.mark.parametrize("objective, dropout", [("dspark", 0.0), ("eagle3", 0.0), ("dspark", 0.3)])
def test_resume_continues_bit_for_bit(tmp_path, objective, dropout):
    straight, _ = tiny_trainer(steps=4, objective=objective, dropout=dropout)
    straight.fit(progress=False)
    first, target = tiny_trainer(steps=4, objective=objective, dropout=dropout)
    for _ in range(2):
        first.train_step()
    first.save(tmp_path / "ckpt")
    torch.manual_seed(1234)  # the masks of the steps after resuming must not depend on the global generator
    second, _ = tiny_trainer(steps=4, objective=objective, dropout=dropout)
    second.resume(tmp_path / "ckpt", target)
    assert second.step == 2
    second.fit(progress=False)
    for (name, a), b in zip(straight.drafter.state_dict().items(), second.drafter.state_dict().values()):
        assert torch.equal(a, b), f"{name} differs after resuming"


def test_resume_refuses_a_checkpoint_of_a_run_with_other_settings(tmp_path):
    """Resuming a checkpoint that another learning rate wrote would mix two runs under one name."""
    first, target = tiny_trainer(steps=4)
    first.train_step()
    first.save(tmp_path / "ckpt")
    other, _ = tiny_trainer(steps=4, lr=1e-3)
    with pytest.raises(ValueError, match=r"lr=0\.003 there, 0\.001 here"):
        other.resume(tmp_path / "ckpt", target)
    # How often a run evaluates or saves does not change its steps, so a resumed run may change it.
    again, _ = tiny_trainer(steps=4, eval_every=2, checkpoint_every=2)
    assert again.resume(tmp_path / "ckpt", target).step == 1


@pytest.mark.parametrize("objective", ["dspark", "eagle3"])
def test_a_continuation_picks_up_the_data_order_and_anchors_where_training_stopped(objective):
    """A run with ``step_offset=k`` draws at its step j the sequences and anchors a straight run draws at step
    k + j (never those it was already trained on), reports steps from k, and restarts the LR schedule."""
    straight, _ = tiny_trainer(steps=5, objective=objective)
    continued, _ = tiny_trainer(steps=2, objective=objective, step_offset=3)
    drawn = {}
    for name, trainer in (("straight", straight), ("continued", continued)):
        calls = drawn[name] = []
        original = trainer._generator
        trainer._generator = lambda step, index, original=original, calls=calls: (
            calls.append((step, index)) or original(step, index))
    rows = [straight.train_step() for _ in range(5)]
    continued_rows = [continued.train_step() for _ in range(2)]
    assert [r["step"] for r in continued_rows] == [4, 5]
    assert drawn["continued"] == [call for call in drawn["straight"] if call[0] >= 3]
    assert continued_rows[0]["lr"] == rows[0]["lr"]  # the warm-up starts over
    with pytest.raises(ValueError, match="step_offset"):
        TrainConfig(step_offset=-1)


@pytest.mark.parametrize("objective", ["dspark", "eagle3"])
def test_two_ranks_match_one_rank(tmp_path, objective):
    import safetensors.torch

    single, _ = tiny_trainer(steps=3, objective=objective)
    single.fit(progress=False)
    out = tmp_path / "ranked.safetensors"
    torch.multiprocessing.spawn(distributed_worker, args=(2, str(tmp_path / "init"), str(out), 3, objective),
                                nprocs=2)
    ranked = safetensors.torch.load_file(out)
    for name, value in single.drafter.state_dict().items():
        # Gradients are summed in another order (two partial sums, then one all-reduce): fp32 rounding only.
        torch.testing.assert_close(ranked[name], value, rtol=1e-5, atol=1e-6, msg=name)


def test_dflash_objective_trains_without_markov_or_confidence():
    trainer, _ = tiny_trainer(steps=3, objective="dflash")
    history = trainer.fit(progress=False)
    last = history[-1]
    assert last["bce"] == 0 and last["ce"] > 0 and last["loss"] == pytest.approx(last["ce"])  # CE only


def test_dspark_objective_with_cross_entropy_alone_keeps_the_markov_and_confidence_heads():
    """``ce_weight=1, l1_weight=0``: the step's loss is CE + BCE; the L1 it reports is measured, not trained."""
    trainer, _ = tiny_trainer(steps=3, ce_weight=1.0, l1_weight=0.0)
    last = trainer.fit(progress=False)[-1]
    assert last["bce"] > 0 and last["l1"] > 0
    assert last["loss"] == pytest.approx(last["ce"] + last["bce"], rel=1e-5)
    recipe = tiny_trainer(steps=3)[0].fit(progress=False)[-1]
    assert recipe["loss"] == pytest.approx(0.1 * recipe["ce"] + 0.9 * recipe["l1"] + recipe["bce"], rel=1e-5)


@pytest.mark.parametrize("settings, match", [
    (dict(objective="dflash", ce_weight=1.0), "apply to the dspark objective"),
    (dict(ce_weight=0.0, l1_weight=0.0), "not both 0"),
    (dict(ce_weight=-0.5), "non-negative"),
    (dict(l1_weight=float("nan")), "finite"),
])
def test_bad_loss_weights_are_refused(settings, match):
    with pytest.raises(ValueError, match=match):
        TrainConfig(**settings)


def test_dropout_changes_training_steps_only_and_leaves_the_global_generator_alone():
    plain, _ = tiny_trainer(steps=3)
    dropped, _ = tiny_trainer(steps=3, dropout=0.3)
    assert dropped.evaluate() == plain.evaluate()  # the same initial weights: evaluation never drops
    state = torch.random.get_rng_state()
    plain_row, dropped_row = plain.train_step(), dropped.train_step()
    assert torch.equal(torch.random.get_rng_state(), state)
    assert dropped_row["loss"] != plain_row["loss"]
    for (name, a), b in zip(plain.drafter.state_dict().items(), dropped.drafter.state_dict().values()):
        if name.startswith("layers."):
            assert not torch.equal(a, b), f"{name}: a step with dropout should move the layers otherwise"


@pytest.mark.parametrize("settings, match", [
    (dict(dropout=1.0), r"dropout must lie in \[0, 1\)"),
    (dict(dropout=-0.1), r"dropout must lie in \[0, 1\)"),
    (dict(objective="eagle3", dropout=0.1), "not 'eagle3'"),
])
def test_bad_dropout_is_refused(settings, match):
    with pytest.raises(ValueError, match=match):
        TrainConfig(**settings)


def test_reweighted_runs_are_named_apart_from_the_recipe():
    assert loss_weights_suffix() == ""
    assert loss_weights_suffix(1.0, 0.0) == "-ce1-l1_0"
    assert loss_weights_suffix(0.5) == "-ce0.5-l1_0.9"  # the unset weight keeps the recipe's value


def test_training_lowers_held_out_loss():
    trainer, _ = tiny_trainer(steps=40, eval_every=40)
    before = trainer.evaluate()
    trainer.fit(progress=False)
    after = trainer.evaluate()
    assert after["eval_l1"] < before["eval_l1"] and after["eval_tau_prob"] > before["eval_tau_prob"]


@pytest.mark.parametrize("head_trainable", [False, True])
def test_bf16_steps_with_a_frozen_or_a_trainable_lm_head(head_trainable):
    """The head is cast to bf16 once per step and shared by the step's sequences: a trainable one must still
    get every sequence's gradient through that one cast."""
    trainer, _ = tiny_trainer(steps=2, precision="bf16")
    trainer.drafter.lm_head.weight.requires_grad_(head_trainable)
    trainer.optimizer.add_param_group({"params": [trainer.drafter.lm_head.weight]} if head_trainable else
                                      {"params": []})
    before = trainer.drafter.lm_head.weight.detach().clone()
    history = trainer.fit(progress=False)
    assert all(torch.isfinite(torch.tensor(row["loss"])) for row in history)
    moved = not torch.equal(trainer.drafter.lm_head.weight.detach(), before)
    assert moved == head_trainable


def test_source_commit_is_dirty_for_code_changes_only(tmp_path):
    import subprocess

    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    (tmp_path / "benchmarks" / "results" / "r.json").write_text("{}")
    (tmp_path / "code.py").write_text("x = 1\n")
    git("init", "-q")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init")
    clean = source_commit(tmp_path)
    assert clean and "-dirty" not in clean and clean != "unknown"
    (tmp_path / "benchmarks" / "results" / "r.json").write_text('{"new": 1}')
    (tmp_path / "benchmarks" / "results" / "other.json").write_text("{}")
    assert source_commit(tmp_path) == clean  # fresh measurements leave the code as committed
    (tmp_path / "code.py").write_text("x = 2\n")
    assert source_commit(tmp_path) == clean + "-dirty"


def test_cpu_allocator_tuning_applies_on_glibc():
    import platform

    assert tune_cpu_allocator() == (platform.system() == "Linux" and platform.libc_ver()[0] == "glibc")


def test_eagle3_unrolled_training_lowers_held_out_loss():
    trainer, _ = tiny_trainer(steps=40, eval_every=40, objective="eagle3")
    before = trainer.evaluate()
    trainer.fit(progress=False)
    after = trainer.evaluate()
    assert after["eval_ce"] < before["eval_ce"] and after["eval_tau_prob"] > before["eval_tau_prob"]
    assert len(after["eval_accuracy"]) == 4  # one accuracy per unrolled step


def test_eagle3_objective_needs_an_eagle3_drafter():
    trainer, target = tiny_trainer(steps=1)
    with pytest.raises(ValueError, match="eagle3"):
        Trainer(trainer.drafter, target.lm_head_weight(), trainer.source, trainer.train,
                TrainConfig(steps=1, objective="eagle3"))


def test_offline_features_equal_online_and_are_validated(tmp_path):
    trainer, target = tiny_trainer()
    samples = trainer.train[:2]
    write_offline_features(target, samples, tmp_path, dtype=torch.float32, progress=False)
    offline = OfflineFeatures(tmp_path, target.tap_layers, target.hidden_size)
    for i, sample in enumerate(samples):
        for a, b in zip(offline.features(i, sample), trainer.source.features(i, sample)):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
    # A held-out sample evaluated through the offline source reads its own file (by key, not position).
    trainer.source, trainer.held_out = offline, [Sample(samples[1].token_ids, samples[1].loss_mask, key=1)]
    assert trainer.evaluate()["eval_tau_prob"] >= 1
    wrong = Sample(samples[0].token_ids.flip(0), samples[0].loss_mask)
    with pytest.raises(ValueError, match="different tokens"):
        offline.features(0, wrong)
    # A rerun keeps valid files and rewrites a corrupted one.
    (tmp_path / "000001.safetensors").write_bytes(b"broken")
    kept = (tmp_path / "000000.safetensors").stat().st_mtime_ns
    write_offline_features(target, samples, tmp_path, dtype=torch.float32, progress=False)
    assert (tmp_path / "000000.safetensors").stat().st_mtime_ns == kept
    for a, b in zip(offline.features(1, samples[1]), trainer.source.features(1, samples[1])):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_sts_calibration_after_training_sets_temperatures():
    from dspark.train.trainer import calibrate_on_samples

    trainer, target = tiny_trainer(steps=10)
    trainer.fit(progress=False)
    report = calibrate_on_samples(target, trainer.drafter.eval(), trainer.train, max_new_tokens=12)
    assert report["rounds"] > 0
    assert trainer.drafter.sts_temperatures.tolist() == pytest.approx(report["temperatures"])
    # STS minimises the ECE it is fitted on: never worse there, position by position.
    for before, after in zip(report["before"]["ece"], report["after"]["ece"]):
        assert after <= before + 1e-12 or before != before


def test_the_recipe_at_toy_size_writes_a_drafter_that_records_its_run(real_target, tmp_path):
    """``train_default_drafter`` end to end, as the committed recipe runs it (features rebuilt from the committed
    answers, a reduced draft vocabulary) but with six sequences and two steps: the drafter loads, and its
    metadata holds the arguments, the timed phases and when it was trained."""
    from dspark.files.checkpoint import load_drafter
    from dspark.runtime.machine import fastest_precision
    from dspark.train.pipeline import train_default_drafter

    path = train_default_drafter(tmp_path / "drafter", steps=2, **toy_recipe(work_dir=tmp_path / "work"))
    meta = json.loads((path / "config.json").read_text(encoding="utf-8"))["metadata"]
    assert meta["run"]["arguments"]["answers"] == RECIPE_ANSWERS.name
    # "auto" is recorded as given, and the precision it resolved to on this machine is what trained.
    assert meta["run"]["arguments"]["precision"] == "auto"
    assert meta["run"]["train_config"]["precision"] == fastest_precision("cpu")
    assert (meta["steps"], meta["train_sequences"], meta["held_out_sequences"]) == (2, 4, 2)
    assert meta["vocab"]["draft_vocab_size"] == 256 and 0 < meta["vocab"]["train_coverage"] <= 1
    assert set(meta["run"]["seconds"]) == {"corpus", "vocab", "train"}
    assert datetime.datetime.fromisoformat(meta["trained_at"]).tzinfo is not None
    assert load_drafter(path, real_target).config.draft_vocab_size == 256


def test_the_recipe_continues_a_drafter_it_wrote_and_refuses_one_trained_otherwise(real_target, tmp_path):
    from dspark.files.checkpoint import load_drafter, save_drafter
    from dspark.train.pipeline import train_default_drafter

    toy = toy_recipe(work_dir=tmp_path / "work")
    parent = train_default_drafter(tmp_path / "parent", steps=2, **toy)
    child = train_default_drafter(tmp_path / "child", steps=2, continue_from=parent, **toy)
    meta = json.loads((child / "config.json").read_text(encoding="utf-8"))["metadata"]
    first = json.loads((parent / "config.json").read_text(encoding="utf-8"))["metadata"]
    assert meta["steps"] == 4 and meta["run"]["parent"]["steps"] == 2
    assert meta["run"]["arguments"]["continue_from"] == "parent"
    assert [row["step"] for row in meta["curve"]] == [0, 2, 4]
    assert meta["curve"][:2] == first["curve"]
    assert meta["final"]["answer_tokens_seen"] > first["final"]["answer_tokens_seen"]
    # Another learning rate is another run: it trains in a checkpoint of its own instead of resuming that one.
    train_default_drafter(tmp_path / "child-lr", steps=2, continue_from=parent, **{**toy, "lr": 1e-4})
    assert len(list((tmp_path / "work").glob("checkpoint-*-after*"))) == 2
    with pytest.raises(ValueError, match="trained otherwise"):
        train_default_drafter(tmp_path / "other", steps=2, continue_from=parent, **{**toy, "objective": "dflash"})
    with pytest.raises(ValueError, match="another shape"):
        train_default_drafter(tmp_path / "other", steps=2, continue_from=parent, **{**toy, "block_size": 5})
    # More layers grow the parent; fewer would throw trained layers away.
    grown = train_default_drafter(tmp_path / "grown", steps=2, continue_from=parent, **{**toy, "num_draft_layers": 2})
    meta = json.loads((grown / "config.json").read_text(encoding="utf-8"))["metadata"]
    assert meta["run"]["parent"]["layers"] == 1 and load_drafter(grown, real_target).config.num_draft_layers == 2
    with pytest.raises(ValueError, match="another shape"):
        train_default_drafter(tmp_path / "other", steps=2, continue_from=grown, **toy)
    bare = save_drafter(load_drafter(parent, real_target), tmp_path / "bare")  # the weights without their record
    with pytest.raises(ValueError, match="no training record"):
        train_default_drafter(tmp_path / "other", steps=2, continue_from=bare, **toy)


def test_averaging_continuations_writes_their_mean_scored_on_the_held_out_split(real_target, tmp_path):
    from dspark.files.checkpoint import SHARED, load_drafter
    from dspark.train.pipeline import average_drafters, train_default_drafter

    toy = toy_recipe(work_dir=tmp_path / "work", eval_every=1)
    parent = train_default_drafter(tmp_path / "parent", steps=2, **toy)
    children = [train_default_drafter(tmp_path / f"child{i}", steps=1, continue_from=parent, **{**toy, "lr": lr})
                for i, lr in enumerate((1e-2, 1e-3))]
    mean = average_drafters(children, tmp_path / "mean", target=real_target, work_dir=tmp_path / "work",
                            calibrate=False, progress=False)
    weights = [load_drafter(d, real_target).state_dict() for d in (*children, mean)]
    name = "layers.0.mlp.down_proj.weight"
    assert not torch.equal(weights[0][name], weights[1][name])
    # The ingredients are stored in bf16, so their fp32 mean rounded to bf16 is exactly what is stored; the
    # shared weights and the draft vocabulary are the same in all.
    for key, value in weights[2].items():
        averaged = value.is_floating_point() and key not in SHARED
        expected = ((weights[0][key] + weights[1][key]) / 2).bfloat16().float() if averaged else weights[0][key]
        assert torch.equal(value, expected), f"{key} is not the ingredients' mean"
    meta = json.loads((mean / "config.json").read_text(encoding="utf-8"))["metadata"]
    assert [a["directory"] for a in meta["average_of"]] == ["child0", "child1"]
    assert meta["held_out_sequences"] == 2 and meta["final"]["eval_tau_prob"] >= 1
    assert meta["steps"] == 3 and meta["run"]["arguments"]["continue_from"] is None
    with pytest.raises(ValueError, match="at least two drafters"):
        average_drafters(children[:1], tmp_path / "other", target=real_target, work_dir=tmp_path / "work")
    # Another held-out split cannot score the mean on sequences that none of them trained on.
    config = json.loads((children[1] / "config.json").read_text(encoding="utf-8"))
    config["metadata"]["run"]["arguments"]["held_out"] = 3
    (children[1] / "config.json").write_text(json.dumps(config), encoding="utf-8")
    with pytest.raises(ValueError, match="trained otherwise.*'held_out': \\(2, 3\\)"):
        average_drafters(children, tmp_path / "other", target=real_target, work_dir=tmp_path / "work")


# The committed recipe's pools (benchmarks/recipes/smollm2_drafter.json), by source.
RECIPE_POOLS = {"code": {"source": "stdlib-code"}, "math": {"source": "word-problems"},
                "math2": {"source": "word-problems", "series": 2}, "math3": {"source": "word-problems", "series": 3},
                "code2": {"source": "stdlib-code", "series": 2}}


def counted(pools: dict, archives: dict | None = None, **counts) -> dict:
    """``pools`` with each named pool's count (and answers archive, when ``archives`` names one)."""
    return {name: {**pools[name], "count": count, **({"answers": archives[name]} if archives else {})}
            for name, count in counts.items()}


def test_the_recipe_adds_pools_to_a_continuation_and_keeps_the_held_out_split(real_target, tmp_path):
    """Code prompts (both series), math prompts (all three series) and a prompt file are answered into corpora of
    their own and train beside the ShareGPT samples: the features are read from the right corpus (a sample read from
    the wrong one fails its token-id check), the vocabulary and the held-out sequences stay the parent's, and the
    counts are recorded."""
    from dspark.runtime.machine import fastest_precision
    from dspark.train.pipeline import train_default_drafter

    (tmp_path / "mine.txt").write_text("Name three rivers in Europe.\nWhat is a prime number?\nSay hello.\n",
                                       encoding="utf-8")
    sources = {**RECIPE_POOLS, "mine": {"source": "file", "path": str(tmp_path / "mine.txt")}}
    toy = toy_recipe(work_dir=tmp_path / "work", sequences_per_step=4, max_new_tokens=192)
    parent = train_default_drafter(tmp_path / "parent", steps=2, **toy)
    pools = counted(sources, code=2, math=2, math2=2, math3=2, code2=2, mine=2)
    child = train_default_drafter(tmp_path / "child", steps=4, continue_from=parent, pools=pools, **toy)
    meta = json.loads((child / "config.json").read_text(encoding="utf-8"))["metadata"]
    first = json.loads((parent / "config.json").read_text(encoding="utf-8"))["metadata"]
    assert (meta["train_sequences"], *(meta[f"{name}_sequences"] for name in pools), meta["held_out_sequences"]) == \
        (16, 2, 2, 2, 2, 2, 2, 2)
    assert meta["run"]["arguments"]["pools"] == [{"name": name, **{k: v for k, v in pool.items()
                                                                    if k != "series" or v != 1}}
                                                 for name, pool in pools.items()]
    assert all(0 < meta["vocab"][f"{name}_coverage"] <= 1 for name in pools)
    assert meta["vocab"]["held_out_coverage"] == first["vocab"]["held_out_coverage"]
    # The child's checkpoint is named after the ShareGPT corpus (6 samples) and each pool's count.
    (checkpoint,) = (tmp_path / "work").glob("checkpoint-*-after*")
    assert checkpoint.name.startswith(f"checkpoint-dspark-layers1-block7-steps4-vocab256-6seq-"
                                      f"{fastest_precision('cpu')}-code2-math2-math22-math32-code22-mine2-after")
    # The file's corpus is named after the file and its contents.
    assert len(list((tmp_path / "work").glob("corpus-*-file-mine-*"))) == 1
    # Four steps of four sequences walk all sixteen training sequences, every pool's among them.
    assert meta["final"]["answer_tokens_seen"] - first["final"]["answer_tokens_seen"] >= meta["train_answer_tokens"]
    for pools, message in [(counted(sources, code=-1), "pool 'code': count must be 0 or more"),
                           (counted(sources, code=10 ** 6), "asks for 1000000 prompts, but its source holds"),
                           (counted(sources, math2=3000), "pool 'math2' asks for 3000 prompts, but its source holds "
                                                          "2000"),
                           (counted(sources, mine=4), "asks for 4 prompts, but its source holds 3"),
                           ({"math3": {**RECIPE_POOLS["math3"], "answers": str(tmp_path / "any.npz")}},
                            "pool 'math3': an answers archive is given but count is 0"),
                           ({"poems": {"source": "poetry", "count": 1}}, "unknown source 'poetry'")]:
        with pytest.raises(ValueError, match=message):
            train_default_drafter(tmp_path / "other", steps=2, pools=pools, **toy)


def test_the_recipe_samples_new_answers_to_the_sharegpt_training_prompts_only(real_target, tmp_path):
    """A ``sharegpt-resampled`` pool answers ShareGPT training prompts once more, sampled at its temperature: every
    sampled sequence starts with a training prompt and none with a held-out one, the answers are not all the greedy
    ones, the corpus records its temperature, and the checkpoint is named after the count and the temperature."""
    from dspark.runtime.machine import fastest_precision
    from dspark.train.corpus import corpus_order, load_corpus
    from dspark.train.pipeline import recipe_corpus_dir, train_default_drafter
    from dspark.train.pools import PoolSpec, load_training_prompts

    toy = toy_recipe(work_dir=tmp_path / "work", sequences_per_step=4, max_new_tokens=192)
    parent = train_default_drafter(tmp_path / "parent", steps=2, **toy)
    again = {"source": "sharegpt-resampled", "temperature": 1.0}
    child = train_default_drafter(tmp_path / "child", steps=2, continue_from=parent,
                                  pools={"sampled": {**again, "count": 4}}, **toy)
    meta = json.loads((child / "config.json").read_text(encoding="utf-8"))["metadata"]
    assert (meta["train_sequences"], meta["sampled_sequences"], meta["held_out_sequences"]) == (8, 4, 2)
    assert meta["run"]["arguments"]["pools"] == [{"name": "sampled", **again, "count": 4}]
    corpus = recipe_corpus_dir(tmp_path / "work", fastest_precision("cpu"), 192)
    greedy = load_corpus(corpus, corpus_order(len(load_training_prompts()))[:6])  # by index: the last two held out
    sampled_dir = PoolSpec.from_dict("sampled", again).corpus_dir(corpus)
    sampled = load_corpus(sampled_dir)

    def prompt(sample) -> list[int]:
        return sample.token_ids[~sample.loss_mask].tolist()

    assert sorted(map(prompt, sampled)) == sorted(map(prompt, greedy[:-2]))
    assert not {tuple(prompt(s)) for s in sampled} & {tuple(prompt(s)) for s in greedy[-2:]}
    greedy_answers = {tuple(prompt(s)): s.token_ids.tolist() for s in greedy}
    assert any(s.token_ids.tolist() != greedy_answers[tuple(prompt(s))] for s in sampled)
    settings = json.loads((sampled_dir / "corpus.json").read_text(encoding="utf-8"))["settings"]
    assert settings["temperature"] == 1.0 and settings["num_prompts"] == 4
    (checkpoint,) = (tmp_path / "work").glob("checkpoint-*-after*")
    assert "-sampled4-t1-after" in checkpoint.name
    for pools, message in [({"sampled": {**again, "temperature": 0.0, "count": 1}}, "temperature above 0"),
                           ({"sampled": {**again, "count": 5}}, "asks for 5 prompts, but its source holds 4"),
                           ({"code": {"source": "stdlib-code", "temperature": 0.7, "count": 1}}, "and only it")]:
        with pytest.raises(ValueError, match=message):
            train_default_drafter(tmp_path / "other", steps=2, pools=pools, **toy)
    with pytest.raises(ValueError, match="holds 6 samples, not more than the 6 held out"):
        train_default_drafter(tmp_path / "other", steps=2, pools={"sampled": {**again, "count": 1}},
                              **{**toy, "held_out": 6})


def test_the_recipe_answers_sharegpt_followups_and_drops_those_of_held_out_conversations(real_target, tmp_path,
                                                                                       monkeypatch):
    """A ``sharegpt-followups`` pool answers that many later ShareGPT turns into a corpus of their own, each
    sequence starting with its turn as the prompt; a turn from a held-out conversation is answered but does not
    train, and the count dropped is recorded."""
    import dspark.train.pools
    from dspark.runtime.machine import fastest_precision
    from dspark.train.corpus import corpus_order, load_corpus
    from dspark.train.pipeline import recipe_corpus_dir, train_default_drafter
    from dspark.train.pools import PoolSpec, load_followup_prompts

    toy = toy_recipe(work_dir=tmp_path / "work", sequences_per_step=4, max_new_tokens=192)
    parent = train_default_drafter(tmp_path / "parent", steps=2, **toy)
    pool = load_followup_prompts()
    first = corpus_order(len(pool))[:3]
    held = {}

    def held_out_followups(held_out: set[str]) -> set[int]:
        held["prompts"] = held_out
        return {first[1]}  # as if the second turn answered came from a held-out conversation

    monkeypatch.setattr(dspark.train.pools, "held_out_followups", held_out_followups)
    later = {"source": "sharegpt-followups"}
    child = train_default_drafter(tmp_path / "child", steps=2, continue_from=parent,
                                  pools={"followup": {**later, "count": 3}}, **toy)
    meta = json.loads((child / "config.json").read_text(encoding="utf-8"))["metadata"]
    assert (meta["train_sequences"], meta["followup_sequences"], meta["followup_held_out_dropped"]) == (6, 2, 1)
    assert meta["run"]["arguments"]["pools"] == [{"name": "followup", **later, "count": 3}]
    assert len(held["prompts"]) == 2  # the ShareGPT openings the run holds out
    corpus = PoolSpec.from_dict("followup", later).corpus_dir(
        recipe_corpus_dir(tmp_path / "work", fastest_precision("cpu"), 192))
    answered = load_corpus(corpus)
    assert sorted(s.key for s in answered) == sorted(first)
    for sample in answered:
        prompt = real_target.tokenizer.decode(sample.token_ids[~sample.loss_mask].tolist())
        assert pool[sample.key] in prompt
    (checkpoint,) = (tmp_path / "work").glob("checkpoint-*-after*")
    assert "-followup3-after" in checkpoint.name


def test_the_recipe_rebuilds_pool_corpora_from_their_archives_without_answering(real_target, tmp_path):
    """On a fresh cache, each pool's answers archive rebuilds its corpus: no prompt is answered again (the
    manifests keep the archives' answering runs and add one rebuild), the samples hold the same tokens, and a
    continuation trains on them as on the answered corpora. With ``features="lazy"`` nothing is rebuilt up front:
    the features on disk afterwards are those the run read, computed as it read them."""
    from dspark.runtime.machine import fastest_precision
    from dspark.train.answers import save_answers
    from dspark.train.corpus import load_corpus
    from dspark.train.pipeline import recipe_corpus_dir, train_default_drafter
    from dspark.train.pools import PoolSpec

    toy = toy_recipe(sequences_per_step=4, max_new_tokens=192)
    parent = train_default_drafter(tmp_path / "parent", steps=2, work_dir=tmp_path / "answered", **toy)
    counts = dict(code=2, math=3, math2=2, math3=2, code2=2)
    answered = train_default_drafter(tmp_path / "answered-child", steps=2, continue_from=parent,
                                     work_dir=tmp_path / "answered", pools=counted(RECIPE_POOLS, **counts), **toy)
    precision = fastest_precision("cpu")
    corpus = recipe_corpus_dir(tmp_path / "answered", precision, 192)

    def pool_dir(name, sharegpt_corpus):
        return PoolSpec.from_dict(name, RECIPE_POOLS[name]).corpus_dir(sharegpt_corpus)

    archives = {name: str(save_answers(pool_dir(name, corpus), tmp_path / f"{name}.answers.npz")) for name in counts}
    with_archives = counted(RECIPE_POOLS, archives, **counts)
    rebuilt = train_default_drafter(tmp_path / "rebuilt-child", steps=2, continue_from=parent,
                                    work_dir=tmp_path / "fresh", pools=with_archives, **toy)
    fresh = recipe_corpus_dir(tmp_path / "fresh", precision, 192)
    for name in counts:
        before, after = (json.loads((pool_dir(name, c) / "corpus.json").read_text(encoding="utf-8"))
                         for c in (corpus, fresh))
        assert after["runs"] == before["runs"] and len(after["rebuilds"]) == 1
        assert [(s.key, s.token_ids.tolist(), s.loss_mask.tolist()) for s in load_corpus(pool_dir(name, corpus))] == \
            [(s.key, s.token_ids.tolist(), s.loss_mask.tolist()) for s in load_corpus(pool_dir(name, fresh))]
    metas = [json.loads((d / "config.json").read_text(encoding="utf-8"))["metadata"] for d in (answered, rebuilt)]
    assert [(*(m[f"{name}_sequences"] for name in counts), m["train_answer_tokens"]) for m in metas] == \
        [(2, 3, 2, 2, 2, metas[0]["train_answer_tokens"])] * 2
    assert [(pool["name"], pool["answers"]) for pool in metas[1]["run"]["arguments"]["pools"]] == \
        [(name, f"{name}.answers.npz") for name in counts]

    lazy = train_default_drafter(tmp_path / "lazy-child", steps=2, continue_from=parent, work_dir=tmp_path / "lazy",
                                 features="lazy", pools=with_archives, **toy)
    meta = json.loads((lazy / "config.json").read_text(encoding="utf-8"))["metadata"]
    assert [meta[f"{name}_sequences"] for name in counts] == [2, 3, 2, 2, 2]
    assert meta["train_answer_tokens"] == metas[0]["train_answer_tokens"]
    assert meta["run"]["arguments"]["features"] == "lazy"
    corpora = [recipe_corpus_dir(tmp_path / "lazy", precision, 192)]
    corpora += [pool_dir(name, corpora[0]) for name in counts]
    assert not any("rebuilds" in json.loads((c / "corpus.json").read_text(encoding="utf-8")) for c in corpora)
    on_disk = sum(len(list(c.glob("[0-9]*.safetensors"))) for c in corpora)
    # Two steps of four sequences and the two held-out ones at most, of the 6 + 11 samples.
    assert meta["lazy_features"]["built"] == on_disk and toy["held_out"] <= on_disk <= 2 * 4 + toy["held_out"]
    with pytest.raises(ValueError, match="features must be 'eager' or 'lazy'"):
        train_default_drafter(tmp_path / "other", steps=2, features="some", work_dir=tmp_path / "lazy", **toy)


def test_the_recipe_precision_resolves_to_a_dtype_this_machine_runs_fast(tmp_path):
    from dspark.runtime.machine import fastest_precision
    from dspark.train.pipeline import train_default_drafter

    assert fastest_precision("cpu") in ("bf16", "fp32")
    assert fastest_precision("cuda") == "bf16"  # decided without timing: GPUs have bf16 units
    with pytest.raises(ValueError, match="precision must be"):
        train_default_drafter(tmp_path / "drafter", precision="fp16", work_dir=tmp_path / "work", progress=False)


def test_a_recipe_of_two_phases_trains_them_in_turn_and_a_rerun_skips_both(real_target, tmp_path, capsys):
    """``run_recipe`` end to end at toy size: the second phase continues the first's drafter at its own
    learning rate, and running the recipe again finds both phases written and trains nothing."""
    from dspark.train.recipe import run_recipe

    settings = {k: v for k, v in toy_recipe().items() if k != "progress"} | {"answers": str(RECIPE_ANSWERS)}
    recipe = tmp_path / "recipe.json"
    recipe.write_text(json.dumps(settings | {"phases": [{"steps": 2, "lr": 1e-3}, {"steps": 2, "lr": 5e-4}]}),
                      encoding="utf-8")
    out = run_recipe(recipe, tmp_path / "drafter", work_dir=tmp_path / "work", progress=False)
    meta = json.loads((out / "config.json").read_text(encoding="utf-8"))["metadata"]
    assert meta["steps"] == 4 and meta["run"]["arguments"]["lr"] == 5e-4
    assert meta["run"]["arguments"]["continue_from"] == "phase01-steps2"
    assert meta["run"]["parent"]["run"]["arguments"]["lr"] == 1e-3
    capsys.readouterr()
    run_recipe(recipe, tmp_path / "drafter", work_dir=tmp_path / "work", progress=False)
    assert capsys.readouterr().out.count("already trained") == 2
