"""bench_generalization picks training sequences evenly, measures only drafters the recipe trained, and keeps an
earlier result's rows of drafters it does not measure."""

import pytest

from benchmarks.bench_generalization import RECIPES, kept_rows, last_run_curve, main, measure, pool_samples, spread
from benchmarks.trained import COMMITTED


def test_training_sequences_are_spread_over_the_split_ends_included():
    keys = list(range(100, 200))
    picked = spread(keys, 5)
    assert picked == [100, 125, 150, 174, 199]  # round(3 · 99 / 4) = 74
    assert len(set(spread(keys, 48))) == 48 and set(spread(keys, 48)) <= set(keys)
    assert spread(keys, 1) == [100]
    assert spread([3, 1, 2], 8) == [3, 1, 2]


def test_a_drafter_of_another_objective_is_refused_before_anything_loads():
    with pytest.raises(SystemExit, match="not a DSpark drafter"):
        measure(None, COMMITTED / "smollm2-135m-instruct-eagle3", 4, {})


def test_the_last_run_curve_starts_at_the_parent_s_last_step():
    curve = [{"step": s, "eval_tau_prob": 1 + s / 1000} for s in (0, 100, 200, 300)]
    continued = {"curve": curve, "run": {"parent": {"steps": 200}}}
    assert last_run_curve(continued) == [{"step": 200, "tau_prob": 1.2}, {"step": 300, "tau_prob": 1.3}]
    assert [c["step"] for c in last_run_curve({"curve": curve, "run": {}})] == [0, 100, 200, 300]


def test_samples_the_cache_lacks_come_from_the_committed_archive(tmp_path):
    archive = RECIPES / "smollm2_drafter.code.answers.npz"
    samples = pool_samples(tmp_path, [5, 2], archive)
    assert [s.key for s in samples] == [2, 5]
    assert all(s.loss_mask.any() and not s.loss_mask[0] for s in samples)
    with pytest.raises(ValueError, match="lacks 2 selected samples"):
        pool_samples(tmp_path, [5, 2], None)


def test_kept_rows_stay_in_order_stamped_where_measured_and_measured_drafters_are_replaced():
    earlier = {"environment": {"commit": "abc1234", "date": "2026-12-05T20:46:20+00:00"}, "samples": 48,
               "rows": [{"drafter": "shipped", "v": 1}, {"drafter": "pass15", "v": 2},
                        {"drafter": "pass18", "v": 3, "measured": {"commit": "0ld0001", "date": "2026-12-01"}}]}
    rows = kept_rows(earlier, [{"drafter": "pass19", "v": 5}, {"drafter": "pass15", "v": 4}], 48)
    assert [(r["drafter"], r["v"]) for r in rows] == [("shipped", 1), ("pass15", 4), ("pass18", 3), ("pass19", 5)]
    assert rows[0]["measured"] == {"commit": "abc1234", "date": "2026-12-05T20:46:20+00:00"}
    assert rows[2]["measured"]["commit"] == "0ld0001"
    assert "measured" not in rows[1] and "measured" not in rows[3]


def test_rows_of_another_group_size_are_not_kept_and_the_refusal_comes_before_any_work(tmp_path):
    with pytest.raises(SystemExit, match="measured on 48 sequences a group beside rows of 8"):
        kept_rows({"samples": 48, "rows": []}, [], 8)
    earlier = tmp_path / "generalization_cpu.json"
    earlier.write_text('{"samples": 48, "rows": []}', encoding="utf-8")
    with pytest.raises(SystemExit, match="beside rows of 8"):
        main(["--samples", "8", "--keep", str(earlier)])
