"""Oracle for dspark.calibration: bins, pairs and the grid search as explicit loops."""

from __future__ import annotations

import math

from dspark.contract import ECE_BINS, PROB_CLAMP


def ece(pred, label, bins=ECE_BINS):
    if not pred:
        return float("nan")
    sums = [[0, 0.0, 0.0] for _ in range(bins)]
    for p, y in zip(pred, label):
        p = min(max(p, PROB_CLAMP), 1 - PROB_CLAMP)
        b = min(int(p * bins), bins - 1)
        sums[b][0] += 1
        sums[b][1] += p
        sums[b][2] += y
    return sum(abs(s[1] - s[2]) for s in sums if s[0]) / len(pred)


def auroc(pred, label):
    pos = [p for p, y in zip(pred, label) if y]
    neg = [p for p, y in zip(pred, label) if not y]
    if not pos or not neg:
        return float("nan")
    wins = sum(1.0 if a > b else 0.5 if a == b else 0.0 for a in pos for b in neg)
    return wins / (len(pos) * len(neg))


def brier(pred, label):
    return sum((p - y) ** 2 for p, y in zip(pred, label)) / len(pred) if pred else float("nan")


def _sigmoid(x):
    return 1 / (1 + math.exp(-x)) if x >= 0 else math.exp(x) / (1 + math.exp(x))


def survival(z_row, temperatures):
    out, alive = [], 1.0
    for z, t in zip(z_row, temperatures):
        alive *= _sigmoid(z / t)
        out.append(alive)
    return out


def position_data(logits, verified, accepted, temperatures, k):
    """Predictions and prefix labels at position k (0-based) over rounds that verified it."""
    preds, labels = [], []
    for z_row, v, a in zip(logits, verified, accepted):
        if k + 1 <= v:
            preds.append(survival(z_row, temperatures)[k])
            labels.append(1.0 if k + 1 <= a else 0.0)
    return preds, labels


def fit_sts(logits, verified, accepted, grid, bins=ECE_BINS):
    """Left-to-right grid search; ties go to the temperature closest to 1 in log scale."""
    gamma = len(logits[0])
    temperatures = [1.0] * gamma
    for k in range(gamma):
        best_t, best_err = 1.0, None
        for t in grid:
            trial = temperatures[:k] + [t] + temperatures[k + 1:]
            preds, labels = position_data(logits, verified, accepted, trial, k)
            if not preds:
                break
            err = ece(preds, labels, bins)
            better = best_err is None or err < best_err - 1e-12
            tied = best_err is not None and abs(err - best_err) <= 1e-12
            tie_closer = tied and abs(math.log(t)) < abs(math.log(best_t))
            if better or tie_closer:
                best_t, best_err = t, err if better else best_err
        temperatures[k] = best_t
    return temperatures
