"""Oracle for dspark.scheduler: Algorithm 1 (method.md §6.2) and the top-K allocation, as written, in Python."""

from __future__ import annotations

from itertools import groupby

import torch


def _survivals(confidence):
    rows = []
    for c_row in confidence.tolist():
        alive, row = 1.0, []
        for c in c_row:
            alive *= c
            row.append(alive)
        rows.append(row)
    return rows


def _limits(num_requests, gamma, valid_len, min_len, max_len):
    hi = [gamma if valid_len is None else int(valid_len[r]) for r in range(num_requests)]
    if max_len is not None:
        hi = [min(h, max_len) for h in hi]
    return [min(min_len, h) for h in hi], hi


def _ranked_groups(a, lo, hi):
    """Groups of candidates (r, j), best first: survival descending, then earlier position.

    Entries with equal survival at the same position are one group, admitted together or not at all.
    """
    entries = [(-a[r][j - 1], j, r) for r in range(len(a)) for j in range(lo[r] + 1, hi[r] + 1) if a[r][j - 1] > 0]
    entries.sort()
    return [[(r, j, -neg) for neg, j, r in group] for _, group in groupby(entries, key=lambda e: (e[0], e[1]))]


def schedule_greedy(confidence, sps, valid_len, *, early_stop, min_len, max_len, base_tokens):
    num_requests, gamma = confidence.shape
    a = _survivals(confidence.double())
    lo, hi = _limits(num_requests, gamma, valid_len, min_len, max_len)
    length = list(lo)
    tokens = base_tokens + num_requests + sum(lo)
    tau = num_requests + sum(a[r][j] for r in range(num_requests) for j in range(lo[r]))
    best_theta, best_length = tau * sps(tokens), list(length)
    for group in _ranked_groups(a, lo, hi):
        if tokens + len(group) > sps.max_tokens:
            break  # capacity
        for r, j, value in group:
            length[r] = j
            tokens += 1
            tau += value
        theta = tau * sps(tokens)
        if theta > best_theta:
            best_theta, best_length = theta, list(length)
        elif early_stop:
            break
    return torch.tensor(best_length, dtype=torch.long)


def allocate_top_k(confidence, budget, valid_len, *, min_len, max_len):
    num_requests, gamma = confidence.shape
    a = _survivals(confidence.double())
    lo, hi = _limits(num_requests, gamma, valid_len, min_len, max_len)
    length = list(lo)
    used = sum(lo)
    for group in _ranked_groups(a, lo, hi):
        if used + len(group) > budget:
            break
        for r, j, _ in group:
            length[r] = j
        used += len(group)
    return torch.tensor(length, dtype=torch.long)
