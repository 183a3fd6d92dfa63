"""Recipes (`python -m dspark train --config`): phases expanded from one JSON file, flags over every phase,
finished phases skipped, and the committed recipe equal to the runs that made the committed drafters."""

import functools
import json
from pathlib import Path

import pytest

import dspark.train.pipeline
from benchmarks.bench_generalization import EARLIER_POOLS
from dspark.train.pools import PoolSpec
from dspark.train.recipe import load_recipe, phase_directories, recipe_pool, run_recipe

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "benchmarks" / "recipes" / "smollm2_drafter.json"


def write_recipe(directory: Path, **recipe) -> Path:
    path = directory / "recipes" / "run.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(recipe), encoding="utf-8")
    return path


def test_a_recipe_expands_into_phases_that_share_its_settings_and_name_archives_relative_to_it(tmp_path):
    path = write_recipe(tmp_path, objective="dspark", markov_rank=8, answers="run.answers.npz",
                        pools={"code": {"source": "stdlib-code", "answers": "code.answers.npz"},
                               "mine": {"source": "file", "path": "mine.txt"}},
                        phases=[{"steps": 10, "lr": 1e-3}, {"steps": 5, "pools": {"code": 7, "mine": 3}}],
                        arms={"dflash": {"objective": "dflash", "phases": 1}})
    first, second = load_recipe(path)
    here = tmp_path / "recipes"
    assert first == {"objective": "dspark", "markov_rank": 8, "answers": str(here / "run.answers.npz"),
                     "steps": 10, "lr": 1e-3, "pools": {}}
    assert second == {"objective": "dspark", "markov_rank": 8, "answers": str(here / "run.answers.npz"), "steps": 5,
                      "pools": {"code": {"source": "stdlib-code", "answers": str(here / "code.answers.npz"),
                                         "count": 7},
                                "mine": {"source": "file", "path": str(here / "mine.txt"), "count": 3}}}
    (arm,) = load_recipe(path, "dflash")
    assert arm == first | {"objective": "dflash"}
    # a recipe without phases is one
    assert load_recipe(write_recipe(tmp_path, steps=50)) == [{"steps": 50, "pools": {}}]


@pytest.mark.parametrize(("recipe", "arm", "message"), [
    ({"stepz": 50}, None, "unknown settings"),
    ({"code_prompts": 5}, None, "unknown settings"),  # pools are named by "pools" and "phases"
    ({"pools": {"poems": "poems.answers.npz"}}, None, "must be an object with a source"),
    ({"pools": {"poems": {"source": "poetry"}}}, None, "unknown source 'poetry'"),
    ({"pools": {"poems": {"answers": "poems.answers.npz"}}}, None, "needs a source"),
    ({"pools": {"code": {"source": "stdlib-code", "series": 3}}}, None, "no series 3"),
    ({"pools": {"again": {"source": "sharegpt-resampled"}}}, None, "temperature above 0"),
    ({"pools": {"mine": {"source": "file"}}}, None, "a path is what the file source needs"),
    ({"pools": {"code": {"source": "stdlib-code"}}, "phases": [{"steps": 5, "pools": {"code": -1}}]}, None,
     "count must be 0 or more"),
    ({"phases": [{"steps": 5, "pools": {"code": 5}}]}, None, "pools do not list"),
    ({"phases": [{"steps": 5, "markov_rank": 4}]}, None, "a phase sets only"),
    ({"phases": [{"steps": 5}]}, "dflash", "no arm"),
    ({"phases": [{"steps": 5}], "arms": {"dflash": {"phases": 2}}}, "dflash", "runs 2 phases"),
])
def test_recipes_that_cannot_run_are_refused(tmp_path, recipe, arm, message):
    with pytest.raises(ValueError, match=message):
        load_recipe(write_recipe(tmp_path, **recipe), arm)


def fake_training(calls: list):
    """Stands in for train_default_drafter: records its call and writes what a real run records of it."""

    @functools.wraps(dspark.train.pipeline.train_default_drafter)  # its signature is what recipes are checked against
    def train(output_dir, *, continue_from=None, work_dir=None, progress=True, **settings):
        calls.append((Path(output_dir), continue_from, settings))
        arguments = {k: Path(v).name if k == "answers" and v is not None else v for k, v in settings.items()}
        arguments["pools"] = [PoolSpec.from_dict(name, pool).record() for name, pool in settings["pools"].items()]
        arguments["continue_from"] = None if continue_from is None else Path(continue_from).name
        Path(output_dir).mkdir(parents=True, exist_ok=True)
        (Path(output_dir) / "config.json").write_text(json.dumps(
            {"format": "dspark-drafter", "metadata": {"run": {"arguments": arguments}}}), encoding="utf-8")
        return Path(output_dir)

    return train


def test_run_recipe_continues_each_phase_from_the_last_and_skips_finished_phases(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(dspark.files.checkpoint, "FORMAT", "dspark-drafter")
    calls = []
    monkeypatch.setattr(dspark.train.pipeline, "train_default_drafter", fake_training(calls))
    path = write_recipe(tmp_path, objective="dspark", phases=[{"steps": 10}, {"steps": 5}, {"steps": 5}])
    out = tmp_path / "drafter"
    run_recipe(path, out, overrides={"precision": "fp32"})
    first, second = phase_directories(out, load_recipe(path))[:2]
    assert (first.name, second.name) == ("phase01-steps10", "phase02-steps15")
    assert [(o, c) for o, c, _ in calls] == [(first, None), (second, first), (out, second)]
    assert [s["precision"] for _, _, s in calls] == ["fp32"] * 3
    assert [s.get("calibrate") for _, _, s in calls] == [False, False, None]  # only the last drafter decodes

    calls.clear()  # stopped after phase 2 and started again: phase 3 alone runs
    (out / "config.json").unlink()
    run_recipe(path, out, overrides={"precision": "fp32"})
    assert [(o, c) for o, c, _ in calls] == [(out, second)]
    assert "phase 1/3 (10 steps): already trained" in capsys.readouterr().out
    calls.clear()  # other settings are another run: nothing is skipped
    run_recipe(path, tmp_path / "other", overrides={"precision": "bf16"})
    assert len(calls) == 3
    with pytest.raises(ValueError, match="each with its own steps"):
        run_recipe(path, out, overrides={"steps": 3})


def recorded_runs(drafter: Path) -> list[dict]:
    """The arguments of every run that trained the drafter at ``drafter``, first run first."""
    run = json.loads((drafter / "config.json").read_text(encoding="utf-8"))["metadata"]["run"]
    runs = []
    while run:
        runs.append(run["arguments"])
        run = (run.get("parent") or {}).get("run")
    return runs[::-1]


@pytest.mark.parametrize(("arm", "drafter"), [
    (None, ROOT / "dspark" / "assets" / "smollm2-135m-instruct-dspark"),
    ("dflash", ROOT / "benchmarks" / "drafters" / "smollm2-135m-instruct-dflash"),
    ("dspark-ce", ROOT / "benchmarks" / "drafters" / "smollm2-135m-instruct-dspark-ce1-l1_0"),
    ("eagle3", ROOT / "benchmarks" / "drafters" / "smollm2-135m-instruct-eagle3")])
def test_the_recipe_is_the_schedule_that_trained_the_committed_drafters(arm, drafter):
    """Every phase of the committed recipe (each arm) equals, setting for setting, the recorded run of the
    committed drafter it rebuilds: the one command reproduces what the thirteen separate commands ran."""
    phases, runs = load_recipe(RECIPE, arm), recorded_runs(drafter)
    assert len(phases) == len(runs)
    for index, (phase, run) in enumerate(zip(phases, runs), 1):
        # "auto" precision is the machine's choice; the first runs were started with the bf16 it resolves to
        # on the CPUs that trained them, which a fresh machine may not have.
        phase.pop("precision")
        pools = phase.pop("pools")
        expected = {k: Path(v).name if k == "answers" and v is not None else v for k, v in phase.items()}
        assert {k: run.get(k) for k in expected} == expected, f"phase {index}"
        # Those runs predate pools as data: they named each pool's count and archive ``<name>_prompts`` and
        # ``<name>_answers``, and the code fixed each name's source.
        assert {k.removesuffix("_prompts"): v for k, v in run.items() if k.endswith("_prompts") and v} == \
            {name: pool["count"] for name, pool in pools.items()}, f"phase {index}"
        for name, pool in pools.items():
            assert {k: v for k, v in pool.items() if k in ("source", "series")} == EARLIER_POOLS[name], name
            # The first runs on a pool answered its prompts themselves; the archive was saved from their corpus
            # afterwards, so a rerun rebuilds the same answers from it instead of answering again.
            if run.get(f"{name}_answers") is not None:
                assert Path(pool["answers"]).name == run[f"{name}_answers"], f"phase {index}, pool {name}"



@pytest.mark.parametrize(("pool", "count", "precision", "message"), [
    (PoolSpec("again", "sharegpt-resampled", temperature=0.7), 10, None, "held-out split"),
    (PoolSpec("code", "stdlib-code"), 10, "fp16", "precision must be"),
    (PoolSpec("code", "stdlib-code"), 0, None, "count must be positive"),
    (PoolSpec("code", "stdlib-code", series=2), 10 ** 6, None, "asks for 1000000 prompts, but its source holds")])
def test_answer_refuses_what_it_cannot_answer_before_loading_the_target(pool, count, precision, message, tmp_path,
                                                                       monkeypatch):
    import dspark.runtime.target

    def no_target(*args, **kwargs):
        raise AssertionError("the target was loaded before the arguments were checked")

    monkeypatch.setattr(dspark.runtime.target, "load_default_target", no_target)
    from dspark.train.pipeline import answer_pool

    with pytest.raises(ValueError, match=message):
        answer_pool(pool, count, tmp_path / "pool.answers.npz", precision=precision, work_dir=tmp_path)


def test_answer_takes_a_pool_the_recipe_names():
    assert recipe_pool(RECIPE, "math2") == PoolSpec("math2", "word-problems", series=2,
                                                    answers=str(RECIPE.parent / "smollm2_drafter.math2.answers.npz"))
    with pytest.raises(ValueError, match="has no pool 'poems'; its pools: code, math"):
        recipe_pool(RECIPE, "poems")


@pytest.mark.parametrize(("argv", "message"), [
    (["train", "--arm", "dflash"], "give the recipe with --config"),
    (["train", "--config", str(RECIPE), "--arm", "medusa"], "no arm 'medusa'"),
    (["train", "--config", str(RECIPE), "--steps", "10"], "12 phases, each with its own steps"),
])
def test_train_refuses_flags_that_do_not_fit_the_recipe_before_training(argv, message, monkeypatch):
    @functools.wraps(dspark.train.pipeline.train_default_drafter)
    def no_training(*args, **kwargs):
        raise AssertionError("training started")

    monkeypatch.setattr(dspark.train.pipeline, "train_default_drafter", no_training)
    from dspark.__main__ import main

    with pytest.raises(SystemExit, match=message):
        main(argv)


@pytest.mark.parametrize(("argv", "message"), [
    (["answer", "--prompts", "5", "--archive", "a.npz"], "2"),  # neither a recipe's pool nor a source
    (["answer", "--config", str(RECIPE), "--source", "stdlib-code", "--prompts", "5"], "2"),
    (["answer", "--config", str(RECIPE), "--prompts", "5"], "2"),  # a recipe but no pool
    (["answer", "--config", str(RECIPE), "--pool", "poems", "--prompts", "5"], "has no pool 'poems'"),
    (["answer", "--source", "poetry", "--prompts", "5", "--archive", "a.npz"], "unknown source 'poetry'"),
    (["answer", "--source", "word-problems", "--series", "4", "--prompts", "5", "--archive", "a.npz"],
     "no series 4"),
    (["answer", "--source", "stdlib-code", "--prompts", "5"], "2"),  # no archive to grow
])
def test_answer_refuses_a_pool_it_cannot_name_before_loading_the_target(argv, message, monkeypatch):
    import dspark.runtime.target

    def no_target(*args, **kwargs):
        raise AssertionError("the target was loaded")

    monkeypatch.setattr(dspark.runtime.target, "load_default_target", no_target)
    from dspark.__main__ import main

    with pytest.raises(SystemExit, match=message):
        main(argv)
