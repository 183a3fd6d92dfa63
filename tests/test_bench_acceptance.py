"""bench_acceptance: --reuse keeps an earlier run's rows only for drafters and settings that did not change, --keep
those of the drafters a run does not name too; --name takes a plain file name."""

import copy

import pytest

from benchmarks.bench_acceptance import kept_rows, main, reusable_rows
from dspark.runtime.prompts import DOMAINS
from paper import common
from paper.sections import acceptance

SETTINGS = {"offset": 50, "max_new_tokens": 64, "torch": "2.13.0+cpu"}
TEMPERATURES = [0.0, 1.0]


def _earlier(**metadata) -> dict:
    rows = [{"drafter": name, "temperature": t, "domain": d, "prompts": 24, "tau": 1.5}
            for name in metadata for t in TEMPERATURES for d in DOMAINS]
    return {"environment": {"torch": "2.13.0+cpu", "commit": "abc1234", "date": "2026-12-04T02:00:53+00:00"},
            "offset": 50, "max_new_tokens": 64, "drafter_metadata": metadata, "rows": rows}


def test_only_unchanged_drafters_are_reused_with_the_commit_they_were_decoded_at():
    earlier = _earlier(dflash={"steps": 8000, "curve": [1, 2]}, dspark={"steps": 12000})
    now = {"dflash": {"curve": [1, 2], "steps": 8000}, "dspark": {"steps": 20000}, "eagle3": {"steps": 2000}}
    kept = reusable_rows(earlier, SETTINGS, now, TEMPERATURES, 24)
    assert set(kept) == {"dflash"}
    rows, provenance = kept["dflash"]
    assert len(rows) == 6 and {r["drafter"] for r in rows} == {"dflash"}
    assert provenance == {"commit": "abc1234", "date": "2026-12-04T02:00:53+00:00"}


def test_rows_reused_twice_keep_their_first_provenance():
    earlier = _earlier(dflash={"steps": 8000})
    earlier["reused"] = {"dflash": {"commit": "0ld0001", "date": "2026-12-01T00:00:00+00:00"}}
    kept = reusable_rows(earlier, SETTINGS, {"dflash": {"steps": 8000}}, TEMPERATURES, 24)
    assert kept["dflash"][1]["commit"] == "0ld0001"


def test_nothing_is_reused_when_settings_prompts_or_cells_differ():
    earlier = _earlier(dflash={"steps": 8000})
    now = {"dflash": {"steps": 8000}}
    for changed in ({"offset": 0}, {"max_new_tokens": 128}, {"torch": "2.11.0"}):
        assert reusable_rows(earlier, {**SETTINGS, **changed}, now, TEMPERATURES, 24) == {}
    assert reusable_rows(earlier, SETTINGS, now, TEMPERATURES, 8) == {}
    assert reusable_rows(earlier, SETTINGS, now, [0.0, 0.7], 24) == {}
    missing = copy.deepcopy(earlier)
    missing["rows"] = [r for r in missing["rows"] if r["domain"] != "code"]
    assert reusable_rows(missing, SETTINGS, now, TEMPERATURES, 24) == {}
    assert reusable_rows(earlier, SETTINGS, now, [0.0], 24) == {}  # a row this run would not decode


def test_the_paper_says_which_rows_were_reused_and_when():
    assert acceptance.reused_sentence({"rows": []}) == ""
    result = {"reused": {"dflash": {"commit": "abc1234", "date": "2026-12-04T02:00:53+00:00"},
                         "eagle3": {"commit": "abc1234", "date": "2026-12-04T02:00:53+00:00"}}}
    sentence = acceptance.reused_sentence(result)
    assert "At commit abc1234 (2026-12-04): DFlash; EAGLE-3-style." in sentence
    assert {"2026", "12", "04"} <= common.printed


@pytest.mark.parametrize("name", ["../acceptance_cpu", "a/b", "", "with space"])
def test_a_results_name_that_is_not_a_plain_file_name_is_refused_before_any_work(name, capsys):
    with pytest.raises(SystemExit):
        main(["--name", name])
    assert "--name takes letters, digits, dashes and underscores" in capsys.readouterr().err


def test_keep_carries_the_drafters_this_run_does_not_name_with_their_provenance():
    earlier = _earlier(shipped={"steps": 61000}, pass18={"steps": 65000}, pass15={"steps": 65000})
    earlier["reused"] = {"pass15": {"commit": "0ld0001", "date": "2026-12-01T00:00:00+00:00"}}
    kept = kept_rows(earlier, SETTINGS, {"shipped", "pass19"}, TEMPERATURES, 24)
    assert set(kept) == {"pass18", "pass15"}
    assert all({r["drafter"] for r in kept[name][0]} == {name} and len(kept[name][0]) == 6 for name in kept)
    assert kept["pass18"][1]["commit"] == "abc1234" and kept["pass15"][1]["commit"] == "0ld0001"


def test_keep_refuses_rather_than_dropping_a_drafter_it_cannot_carry():
    earlier = _earlier(shipped={"steps": 61000}, pass18={"steps": 65000})
    with pytest.raises(SystemExit, match=r"cannot keep \['pass18'\]"):
        kept_rows(earlier, SETTINGS, {"shipped"}, TEMPERATURES, 8)
    assert kept_rows(earlier, SETTINGS, {"shipped", "pass18"}, TEMPERATURES, 8) == {}


def test_keep_without_a_file_to_keep_from_is_refused_before_any_work(capsys):
    with pytest.raises(SystemExit):
        main(["--keep"])
    assert "give --reuse FILE" in capsys.readouterr().err
