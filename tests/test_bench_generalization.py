"""bench_generalization picks training sequences evenly and measures only drafters the recipe trained."""

import pytest

from benchmarks.bench_generalization import RECIPES, last_run_curve, measure, pool_samples, spread
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
