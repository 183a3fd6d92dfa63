import pytest
import torch
from dspark.reference import calibration as ref
from hypothesis import given
from hypothesis import strategies as st

from dspark.calibration import (
    auroc,
    brier_score,
    calibration_report,
    default_grid,
    expected_calibration_error,
    fit_sts,
    reliability_bins,
    survival_from_logits,
)


@given(n=st.integers(0, 40), seed=st.integers(0, 2**31), ties=st.booleans())
def test_ece_auroc_brier_match_reference(n, seed, ties):
    gen = torch.Generator().manual_seed(seed)
    pred = torch.rand(n, generator=gen, dtype=torch.float64)
    if ties:
        pred = (pred * 4).round() / 4
    label = (torch.rand(n, generator=gen, dtype=torch.float64) < pred).double()
    p, y = pred.tolist(), label.tolist()
    for got, want in [(expected_calibration_error(pred, label), ref.ece(p, y)), (auroc(pred, label), ref.auroc(p, y))]:
        if want != want:  # NaN: no data or one class only
            assert torch.isnan(got)
        else:
            assert float(got) == pytest.approx(want, rel=1e-12, abs=1e-12)
    if n:
        assert float(brier_score(pred, label)) == pytest.approx(ref.brier(p, y), rel=1e-12)


@given(n=st.integers(1, 60), seed=st.integers(0, 2**31), bins=st.integers(1, 12))
def test_reliability_bins_reproduce_the_ece(n, seed, bins):
    """ECE is the count-weighted gap of the diagram's bins, so the two must agree exactly."""
    gen = torch.Generator().manual_seed(seed)
    pred = torch.rand(n, generator=gen, dtype=torch.float64)
    label = (torch.rand(n, generator=gen, dtype=torch.float64) < pred).double()
    diagram = reliability_bins(pred, label, bins)
    count = torch.tensor(diagram["count"], dtype=torch.float64)
    assert int(count.sum()) == n
    filled = count > 0
    means = torch.tensor(diagram["mean_prediction"], dtype=torch.float64)
    gap = (means - torch.tensor(diagram["frequency"], dtype=torch.float64)).abs()
    ece = float((count[filled] * gap[filled]).sum()) / n
    assert ece == pytest.approx(float(expected_calibration_error(pred, label, bins)), rel=1e-12, abs=1e-12)
    lower = torch.arange(bins, dtype=torch.float64) / bins
    assert bool(((means[filled] >= lower[filled] - 1e-12) & (means[filled] <= lower[filled] + 1 / bins + 1e-12)).all())


def synthetic_rounds(n, gamma, *, seed, distortion=1.0):
    """Rounds whose true conditional acceptance is σ(t_k); the head reports distortion·t_k."""
    gen = torch.Generator().manual_seed(seed)
    true_logits = torch.randn(n, gamma, generator=gen, dtype=torch.float64) * 1.2 + 1.0
    accept = torch.rand(n, gamma, generator=gen, dtype=torch.float64) < torch.sigmoid(true_logits)
    accepted = accept.long().cumprod(-1).sum(-1)
    verified = torch.full((n,), gamma, dtype=torch.long)
    return true_logits * distortion, verified, accepted


@given(seed=st.integers(0, 2**31))
def test_fit_sts_matches_reference(seed):
    logits, verified, accepted = synthetic_rounds(25, 3, seed=seed, distortion=2.0)
    gen = torch.Generator().manual_seed(seed)
    verified = torch.maximum(accepted, torch.randint(0, 4, (25,), generator=gen))
    grid = default_grid()[::6]
    got = fit_sts(logits, verified, accepted, grid)
    want = ref.fit_sts(logits.tolist(), verified.tolist(), accepted.tolist(), grid.tolist())
    assert got.tolist() == pytest.approx(want, rel=1e-12)


def test_sts_fixes_an_overconfident_head():
    fit = synthetic_rounds(20_000, 7, seed=0, distortion=3.0)
    held_out = synthetic_rounds(20_000, 7, seed=1, distortion=3.0)
    temperatures = fit_sts(*fit)
    before = calibration_report(*held_out)
    after = calibration_report(*held_out, temperatures)
    assert all(t > 1.5 for t in temperatures.tolist()), f"an overconfident head needs T > 1, got {temperatures}"
    for k, (b, a) in enumerate(zip(before.ece, after.ece)):
        assert a < 0.5 * b, f"position {k + 1}: ECE {b:.4f} -> {a:.4f}"
    # Scaling one logit is monotone, so position 1 keeps its ranking (AUROC); later positions multiply
    # differently scaled factors and may reorder.
    assert after.auroc[0] == pytest.approx(before.auroc[0], abs=1e-12)


def test_sts_leaves_a_calibrated_head_essentially_unchanged():
    fit = synthetic_rounds(100_000, 7, seed=2)
    held_out = synthetic_rounds(100_000, 7, seed=3)
    temperatures = fit_sts(*fit)
    # The ECE of a calibrated head is flat near T = 1 up to sampling noise (~sqrt(bins / N) = 0.014 here at
    # most), which can move the minimum by a grid step or two (2^0.1 each), never further.
    assert bool((temperatures.log2().abs() <= 0.2 + 1e-12).all()), temperatures
    before, after = calibration_report(*held_out), calibration_report(*held_out, temperatures)
    assert max(before.ece) < 0.01
    assert max(a - b for a, b in zip(after.ece, before.ece)) < 0.002
    moved = (survival_from_logits(held_out[0], temperatures) - survival_from_logits(held_out[0])).abs().mean()
    assert moved < 0.005


def test_prefix_labels_keep_rejections_as_zeros_and_drop_unverified():
    logits = torch.zeros(2, 3, dtype=torch.float64)
    report = calibration_report(logits, torch.tensor([3, 1]), torch.tensor([1, 1]))
    assert report.count == [2, 1, 1]
    # Position 1: both verified and accepted -> labels 1; survival 0.5 -> ECE 0.5.
    assert report.ece[0] == pytest.approx(0.5)


def test_bad_calibration_input_raises():
    with pytest.raises(ValueError, match="accepted <= verified"):
        fit_sts(torch.zeros(2, 3), torch.tensor([1, 1]), torch.tensor([2, 0]))
    with pytest.raises(ValueError, match="positive"):
        fit_sts(torch.zeros(2, 3), torch.tensor([1, 1]), torch.tensor([1, 0]), grid=torch.tensor([0.0, 1.0]))
