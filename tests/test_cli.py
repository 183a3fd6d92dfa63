"""`python -m dspark train` settings: defaults, then a JSON config file, then flags; unknown keys refused."""

import argparse
import json

import pytest

from dspark.__main__ import _train_settings


def _args(**flags):
    base = dict(config=None, objective=None, steps=None, prompts=None, layers=None, block_size=None, precision=None,
                ce_weight=None, l1_weight=None)
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
