"""`python -m dspark train` settings: defaults, then a JSON config file, then flags; unknown keys refused."""

import argparse
import json
from pathlib import Path

import pytest

from dspark.__main__ import _train_settings


def _args(**flags):
    base = dict(config=None, objective=None, steps=None, prompts=None, layers=None, block_size=None, precision=None,
                ce_weight=None, l1_weight=None, continue_from=None)
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


def test_unknown_config_keys_are_refused(tmp_path):
    config = tmp_path / "run.json"
    config.write_text(json.dumps({"stepz": 50}), encoding="utf-8")
    with pytest.raises(SystemExit, match="unknown settings"):
        _train_settings(_args(config=str(config)))


def test_a_config_names_its_answers_archive_relative_to_itself(tmp_path, monkeypatch):
    (tmp_path / "recipes").mkdir()
    config = tmp_path / "recipes" / "run.json"
    config.write_text(json.dumps({"answers": "run.answers.npz"}), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    assert _train_settings(_args(config="recipes/run.json"))["answers"] == str(tmp_path / "recipes" / "run.answers.npz")


def test_a_config_names_the_drafter_it_continues_relative_to_itself(tmp_path, monkeypatch):
    (tmp_path / "recipes").mkdir()
    config = tmp_path / "recipes" / "more.json"
    config.write_text(json.dumps({"continue_from": "../drafters/first"}), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    settings = _train_settings(_args(config="recipes/more.json"))
    assert Path(settings["continue_from"]).resolve() == tmp_path / "drafters" / "first"
    assert _train_settings(_args(config="recipes/more.json", continue_from="elsewhere"))["continue_from"] == "elsewhere"


@pytest.mark.parametrize("name", ["smollm2_drafter_continued.json", "smollm2_dflash_continued.json",
                                  "smollm2_drafter_ce_continued.json"])
def test_the_committed_continuations_name_committed_drafters_of_the_recipe(name):
    recipes = Path(__file__).resolve().parents[1] / "benchmarks" / "recipes"
    config = json.loads((recipes / name).read_text(encoding="utf-8"))
    parent = json.loads((recipes / config["continue_from"] / "config.json").read_text(encoding="utf-8"))["metadata"]
    recipe = json.loads((recipes / "smollm2_drafter.json").read_text(encoding="utf-8"))
    assert parent["objective"] == config["objective"]
    assert parent["run"]["arguments"]["steps"] == recipe["steps"] == parent["steps"]
    for weight in ("ce_weight", "l1_weight"):  # a continuation keeps its parent's loss
        assert parent["run"]["arguments"].get(weight) == config.get(weight)
