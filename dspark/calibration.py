"""Calibration of the confidence head: ECE, AUROC, Brier, and Sequential Temperature Scaling (method.md §5.2).

Data are held-out rounds drafted with no truncation: per round the raw confidence logits ``z [γ]``, how
many slots were verified, and how many were accepted (A). Position k's label is the realised prefix
event ``1[k ≤ A]`` (verified slots after the first rejection stay in as zeros), and its prediction is the
survival ``a_k(T) = Π_{i≤k} σ(z_i / T_i)``. STS fits ``T_1, T_2, …`` left to right, each by a grid search
that minimises the ECE of ``a_k`` with the earlier temperatures fixed. Collecting such rounds by decoding
with a real target is :func:`dspark.runtime.calibrate.calibrate_drafter`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dspark._checks import check_tensor
from dspark.contract import ECE_BINS, PROB_CLAMP


def default_grid() -> torch.Tensor:
    """61 log-spaced temperatures ``2^(i/10)``, i = −30..30 (contains 1.0) [method.md §5.2, S21]."""
    return 2.0 ** (torch.arange(-30, 31, dtype=torch.float64) / 10)


def expected_calibration_error(pred: torch.Tensor, label: torch.Tensor, bins: int = ECE_BINS) -> torch.Tensor:
    """``Σ_b (n_b/N)·|mean pred − mean label|`` over equal-width bins of ``[0, 1]`` (last bin closed).

    Predictions are clamped to ``[1e-8, 1 − 1e-8]`` as DeepSpec's recorder does. Empty input gives NaN.
    """
    check_tensor("pred", pred, ndim=1, floating=True)
    check_tensor("label", label, shape=tuple(pred.shape))
    if pred.numel() == 0:
        return torch.tensor(float("nan"), dtype=torch.float64)
    pred = pred.double().clamp(PROB_CLAMP, 1 - PROB_CLAMP)
    label = label.double()
    index = (pred * bins).long().clamp(max=bins - 1)
    pred_sum = torch.zeros(bins, dtype=torch.float64).index_add_(0, index, pred)
    label_sum = torch.zeros(bins, dtype=torch.float64).index_add_(0, index, label)
    return (pred_sum - label_sum).abs().sum() / pred.numel()


def reliability_bins(pred: torch.Tensor, label: torch.Tensor, bins: int = 10) -> dict[str, list]:
    """The reliability diagram's data: per equal-width bin of ``[0, 1]``, the count, mean prediction and
    empirical frequency (NaN for empty bins). Same binning and clamping as :func:`expected_calibration_error`."""
    check_tensor("pred", pred, ndim=1, floating=True)
    check_tensor("label", label, shape=tuple(pred.shape))
    pred = pred.double().clamp(PROB_CLAMP, 1 - PROB_CLAMP)
    index = (pred * bins).long().clamp(max=bins - 1)
    count = torch.zeros(bins, dtype=torch.float64).index_add_(0, index, torch.ones_like(pred))
    pred_sum = torch.zeros(bins, dtype=torch.float64).index_add_(0, index, pred)
    label_sum = torch.zeros(bins, dtype=torch.float64).index_add_(0, index, label.double())
    empty = count == 0
    mean_pred = torch.where(empty, float("nan"), pred_sum / count.clamp(min=1))
    frequency = torch.where(empty, float("nan"), label_sum / count.clamp(min=1))
    return {"count": count.long().tolist(), "mean_prediction": mean_pred.tolist(), "frequency": frequency.tolist()}


def auroc(pred: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
    """Area under the ROC curve: P(pred of a positive > pred of a negative), ties counting ½. NaN if one class."""
    pred, label = pred.double().flatten(), label.bool().flatten()
    positives, negatives = int(label.sum()), int((~label).sum())
    if positives == 0 or negatives == 0:
        return torch.tensor(float("nan"), dtype=torch.float64)
    order = pred.argsort()
    sorted_pred = pred[order]
    ranks = torch.empty_like(pred)
    ranks[order] = torch.arange(1, pred.numel() + 1, dtype=torch.float64)
    # Average the ranks of tied predictions.
    _, inverse, counts = torch.unique_consecutive(sorted_pred, return_inverse=True, return_counts=True)
    ends = counts.cumsum(0).double()
    mean_rank = ends - (counts.double() - 1) / 2
    ranks[order] = mean_rank[inverse]
    return (ranks[label].sum() - positives * (positives + 1) / 2) / (positives * negatives)


def brier_score(pred: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
    return ((pred.double() - label.double()) ** 2).mean()


def prefix_labels(verified: torch.Tensor, accepted: torch.Tensor, block_size: int):
    """``(label [N, γ], valid [N, γ])``: label ``1[k ≤ A]``, valid for verified slots ``k ≤ verified``."""
    slots = torch.arange(1, block_size + 1, device=verified.device)
    return (slots <= accepted[:, None]), (slots <= verified[:, None])


def survival_from_logits(logits: torch.Tensor, temperatures: torch.Tensor | None = None) -> torch.Tensor:
    scaled = logits.double() if temperatures is None else logits.double() / temperatures.double()
    return torch.sigmoid(scaled).cumprod(-1)


@dataclass
class CalibrationReport:
    """Per-position ECE, AUROC and Brier of the survival ``a_k`` against the prefix label (NaN: no data)."""

    ece: list[float]
    auroc: list[float]
    brier: list[float]
    count: list[int]

    def as_dict(self) -> dict:
        return {"ece": self.ece, "auroc": self.auroc, "brier": self.brier, "count": self.count}


def calibration_report(
    logits: torch.Tensor, verified: torch.Tensor, accepted: torch.Tensor, temperatures: torch.Tensor | None = None
) -> CalibrationReport:
    """Reliability of the cumulative prediction at every position (DeepSpec's metrics mode, method.md §5.3).

    Args:
        logits: ``[N, γ]`` raw confidence logits of N held-out rounds.
        verified: ``[N]`` slots verified in each round.
        accepted: ``[N]`` accepted-prefix length A of each round.
        temperatures: ``[γ]`` STS temperatures, or ``None`` for the raw head.
    """
    _check_rounds(logits, verified, accepted)
    label, valid = prefix_labels(verified, accepted, logits.shape[1])
    survival = survival_from_logits(logits, temperatures)
    ece, area, brier, count = [], [], [], []
    for k in range(logits.shape[1]):
        pred, lab = survival[valid[:, k], k], label[valid[:, k], k]
        ece.append(float(expected_calibration_error(pred, lab)))
        area.append(float(auroc(pred, lab)))
        brier.append(float(brier_score(pred, lab)) if pred.numel() else float("nan"))
        count.append(int(pred.numel()))
    return CalibrationReport(ece, area, brier, count)


def fit_sts(
    logits: torch.Tensor,
    verified: torch.Tensor,
    accepted: torch.Tensor,
    grid: torch.Tensor | None = None,
    bins: int = ECE_BINS,
) -> torch.Tensor:
    """Sequential Temperature Scaling: ``[γ]`` temperatures fitted left to right (method.md §5.2).

    For each position k the grid value minimising the ECE of ``a_k`` over rounds that verified slot k is
    chosen, earlier temperatures fixed. Ties (within 1e-12) go to the temperature closest to 1 in log
    scale, so a flat objective leaves the head unchanged; a position with no data keeps T = 1.
    """
    _check_rounds(logits, verified, accepted)
    grid = default_grid() if grid is None else grid.double()
    check_tensor("grid", grid, ndim=1, floating=True, finite=True)
    if grid.numel() == 0 or bool((grid <= 0).any()):
        raise ValueError("grid must be a non-empty list of positive temperatures")
    label, valid = prefix_labels(verified, accepted, logits.shape[1])
    gamma = logits.shape[1]
    temperatures = torch.ones(gamma, dtype=torch.float64)
    prefix = torch.ones(logits.shape[0], dtype=torch.float64)  # a_{k-1} with fitted T_1..T_{k-1}
    preference = grid.log().abs()
    z = logits.double()
    for k in range(gamma):
        rows = valid[:, k]
        if bool(rows.any()):
            # [G, n] survival at position k for every candidate temperature.
            candidates = prefix[rows] * torch.sigmoid(z[rows, k][None, :] / grid[:, None])
            errors = torch.stack([expected_calibration_error(c, label[rows, k], bins) for c in candidates])
            best = errors.min()
            tied = (errors - best).abs() <= 1e-12
            temperatures[k] = grid[torch.where(tied, preference, torch.full_like(preference, float("inf"))).argmin()]
        prefix = prefix * torch.sigmoid(z[:, k] / temperatures[k])
    return temperatures


def _check_rounds(logits, verified, accepted) -> None:
    check_tensor("logits", logits, ndim=2, floating=True, finite=True)
    check_tensor("verified", verified, shape=(logits.shape[0],), integer=True)
    check_tensor("accepted", accepted, shape=(logits.shape[0],), integer=True)
    if bool((accepted > verified).any()) or bool((verified > logits.shape[1]).any()) or bool((accepted < 0).any()):
        raise ValueError(f"need 0 <= accepted <= verified <= γ={logits.shape[1]} in every round")
