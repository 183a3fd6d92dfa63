"""benchmarks.trained: a drafter in the cache wins over the committed one, and when it was trained is never
guessed from a checked-out file's mtime."""

import json
import os

import pytest

import benchmarks.trained as trained
from benchmarks.trained import ARMS, COMMITTED, candidates, equal_budget_drafters, trained_at, trained_drafters
from dspark.files.checkpoint import shipped_drafter_dir


def _drafter(directory, metadata):
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps({"metadata": metadata}), encoding="utf-8")
    (directory / "model.safetensors").write_bytes(b"")
    return directory


def test_the_cache_wins_and_every_arm_falls_back_to_a_committed_drafter(tmp_path, monkeypatch):
    monkeypatch.setenv("DSPARK_CACHE", str(tmp_path))
    assert candidates("dspark")[1] == shipped_drafter_dir()
    assert candidates("dflash")[1] == COMMITTED / "smollm2-135m-instruct-dflash"
    # the name `python -m dspark train --ce-weight 1 --l1-weight 0` writes to by default
    assert candidates("dspark-ce")[0] == tmp_path / "drafters" / "smollm2-135m-instruct-dspark-ce1-l1_0"
    committed = trained_drafters()
    cached = _drafter(tmp_path / "drafters" / "smollm2-135m-instruct-dflash", {})
    assert trained_drafters() == {**committed, "dflash": cached}
    assert set(committed) <= set(ARMS) and committed["dspark"] == shipped_drafter_dir()


def test_the_dspark_drafter_at_dflash_budget_is_found_only_when_dspark_trained_longer(tmp_path, monkeypatch):
    monkeypatch.setattr(trained, "COMMITTED", tmp_path / "committed")
    dflash = _drafter(tmp_path / "dflash", {"steps": 8000})
    longer = _drafter(tmp_path / "dspark", {"steps": 10000})
    assert equal_budget_drafters({"dspark": longer, "dflash": dflash}) == {}  # no earlier drafter kept
    earlier = _drafter(tmp_path / "committed" / f"{ARMS['dspark']}-steps8000", {"steps": 8000})
    assert equal_budget_drafters({"dspark": longer, "dflash": dflash}) == {"dspark-steps8000": earlier}
    same = _drafter(tmp_path / "dspark-same", {"steps": 8000})
    assert equal_budget_drafters({"dspark": same, "dflash": dflash}) == {}
    assert equal_budget_drafters({"dspark": longer}) == {}
    _drafter(tmp_path / "committed" / f"{ARMS['dspark']}-steps6000", {"steps": 8000})  # misnamed: not trusted
    assert equal_budget_drafters({"dspark": longer, "dflash": _drafter(tmp_path / "d6", {"steps": 6000})}) == {}


def test_unknown_arm_is_refused():
    with pytest.raises(ValueError, match="unknown arm"):
        candidates("medusa")


def test_trained_at_is_recorded_or_the_cache_mtime_never_a_checkout_mtime(tmp_path, monkeypatch):
    monkeypatch.setenv("DSPARK_CACHE", str(tmp_path / "cache"))
    recorded = _drafter(tmp_path / "elsewhere" / "a", {"trained_at": "2026-01-02T03:04:05+00:00"})
    assert trained_at(recorded) == "2026-01-02T03:04:05+00:00"
    assert trained_at(_drafter(tmp_path / "elsewhere" / "b", {})) is None
    cached = _drafter(tmp_path / "cache" / "drafters" / "c", {})
    os.utime(cached / "config.json", (0, 86400))
    assert trained_at(cached) == "1970-01-02T00:00:00+00:00"
    assert trained_at(shipped_drafter_dir()) is not None


def test_each_retired_drafter_names_the_recipe_phase_that_rebuilds_it():
    from benchmarks.retire_drafters import RECORD, rebuilding_phase

    retired = json.loads(RECORD.read_text(encoding="utf-8"))
    assert retired
    for name, record in retired.items():
        assert not (COMMITTED / name).exists(), f"{name} is retired but still committed"
        assert len(record["sha256"]) == 64 and int(record["sha256"], 16) >= 0
        arm, phase, _ = rebuilding_phase(name)
        assert (record["arm"], record["phase"]) == (arm, phase)
        assert record["config"]["metadata"]["steps"] == int(name.rsplit("-steps", 1)[1])


def test_a_name_no_phase_ends_at_is_refused():
    from benchmarks.retire_drafters import rebuilding_phase

    with pytest.raises(ValueError, match="no phase of arm 'dspark' ends at step 5000"):
        rebuilding_phase(f"{ARMS['dspark']}-steps5000")
    with pytest.raises(ValueError, match="no arm writes"):
        rebuilding_phase("someone-else-steps4000")
