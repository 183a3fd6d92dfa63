"""`python -m dspark train` settings: defaults, then a JSON config file, then flags; unknown keys refused."""

import argparse
import json
from pathlib import Path

import pytest

from dspark.__main__ import _train_settings


def _args(**flags):
    base = dict(config=None, objective=None, steps=None, prompts=None, layers=None, block_size=None, precision=None,
                ce_weight=None, l1_weight=None, continue_from=None, features=None)
    return argparse.Namespace(**{**base, **flags})


def test_config_file_then_flags(tmp_path):
    config = tmp_path / "run.json"
    config.write_text(json.dumps({"objective": "eagle3", "steps": 50, "markov_rank": 8, "precision": "auto"}),
                      encoding="utf-8")
    assert _train_settings(_args()) == {"objective": "dspark"}
    assert _train_settings(_args(config=str(config), steps=10, block_size=15, precision="fp32")) == {
        "objective": "eagle3", "steps": 10, "markov_rank": 8, "block_size": 15, "precision": "fp32"}
    assert _train_settings(_args(config=str(config), objective="dspark", ce_weight=1.0, l1_weight=0.0)) == {
        "objective": "dspark", "steps": 50, "markov_rank": 8, "precision": "auto", "ce_weight": 1.0, "l1_weight": 0.0}
    assert _train_settings(_args(config=str(config), features="lazy"))["features"] == "lazy"


def test_unknown_config_keys_are_refused(tmp_path):
    config = tmp_path / "run.json"
    config.write_text(json.dumps({"stepz": 50}), encoding="utf-8")
    with pytest.raises(SystemExit, match="unknown settings"):
        _train_settings(_args(config=str(config)))


def test_a_config_names_its_answers_archives_relative_to_itself(tmp_path, monkeypatch):
    (tmp_path / "recipes").mkdir()
    config = tmp_path / "recipes" / "run.json"
    archives = {"answers": "run.answers.npz", "code_answers": "code.answers.npz", "math_answers": "math.answers.npz",
                "math2_answers": "math2.answers.npz", "math3_answers": "math3.answers.npz",
                "code2_answers": "code2.answers.npz", "sampled_answers": "sampled.answers.npz",
                "followup_answers": "followup.answers.npz"}
    config.write_text(json.dumps(archives), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    settings = _train_settings(_args(config="recipes/run.json"))
    assert {key: settings[key] for key in archives} == {key: str(tmp_path / "recipes" / name)
                                                         for key, name in archives.items()}


def test_a_config_names_the_drafter_it_continues_relative_to_itself(tmp_path, monkeypatch):
    (tmp_path / "recipes").mkdir()
    config = tmp_path / "recipes" / "more.json"
    config.write_text(json.dumps({"continue_from": "../drafters/first"}), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    settings = _train_settings(_args(config="recipes/more.json"))
    assert Path(settings["continue_from"]).resolve() == tmp_path / "drafters" / "first"
    assert _train_settings(_args(config="recipes/more.json", continue_from="elsewhere"))["continue_from"] == "elsewhere"


@pytest.mark.parametrize("arm", ["drafter", "dflash", "drafter_ce"])
@pytest.mark.parametrize("data_pass", [3, 4])
def test_the_committed_continuations_name_committed_drafters_of_the_recipe(arm, data_pass):
    recipes = Path(__file__).resolve().parents[1] / "benchmarks" / "recipes"
    config = json.loads((recipes / f"smollm2_{arm}_pass{data_pass}.json").read_text(encoding="utf-8"))
    parent = json.loads((recipes / config["continue_from"] / "config.json").read_text(encoding="utf-8"))["metadata"]
    recipe = json.loads((recipes / "smollm2_drafter.json").read_text(encoding="utf-8"))
    assert parent["objective"] == config["objective"]
    runs = []  # the parent's training runs, last first
    run = parent["run"]
    while run:
        runs.append(run)
        run = (run.get("parent") or {}).get("run")
    # The recipe's steps are two passes over the data; each continuation before this one added a pass.
    assert [r["arguments"]["steps"] for r in reversed(runs)] == [recipe["steps"]] + [config["steps"]] * (data_pass - 3)
    assert parent["steps"] == recipe["steps"] + config["steps"] * (data_pass - 3)
    for weight in ("ce_weight", "l1_weight"):  # a continuation keeps its parent's loss
        assert all(r["arguments"].get(weight) == config.get(weight) for r in runs)


def test_answer_offers_every_pool_but_the_sampled_one():
    from dspark.__main__ import GROWABLE_POOLS
    from dspark.training import POOL_NAMES

    assert GROWABLE_POOLS == tuple(name for name in POOL_NAMES if name != "sampled")


@pytest.mark.parametrize(("pool", "count", "precision", "message"), [
    ("sampled", 10, None, "held-out split"), ("sharegpt", 10, None, "pool must be one of"),
    ("followup", 10, "fp16", "precision must be"), ("followup", 0, None, "count must be positive")])
def test_answer_refuses_what_it_cannot_answer_before_loading_the_target(pool, count, precision, message, tmp_path,
                                                                       monkeypatch):
    import dspark.target

    def no_target(*args, **kwargs):
        raise AssertionError("the target was loaded before the arguments were checked")

    monkeypatch.setattr(dspark.target, "load_default_target", no_target)
    from dspark.training import answer_pool

    with pytest.raises(ValueError, match=message):
        answer_pool(pool, count, tmp_path / "pool.answers.npz", precision=precision, work_dir=tmp_path)
