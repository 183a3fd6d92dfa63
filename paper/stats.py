"""Statistics the sections share: paired gaps with bootstrap intervals over prompts, and slopes per doubling."""

from __future__ import annotations

import math

import numpy as np

from paper.common import num


def gap_cells(gaps: dict[str, tuple[float, float, float]]) -> str:
    """"math +x [lo, hi]; code ...; chat ..." for :func:`paired_gap`'s results by domain."""
    return "; ".join(f"{d} {num(g[0], '+.3f')} [{num(g[1], '+.3f')}, {num(g[2], '+.3f')}]" for d, g in gaps.items())


def paired_gap(rows: list[dict], a: str, b: str, temperature: float, domain: str, draws: int = 10_000,
                seed: int = 0) -> tuple[float, float, float] | None:
    """τ of drafter ``a`` minus drafter ``b`` on one domain, with the 95% percentile interval of a bootstrap that
    resamples prompts (the same resample for both drafters); None without per-prompt counts for both."""
    def counts(name):
        for r in rows:
            if (r["drafter"], r["temperature"], r["domain"]) == (name, temperature, domain) and "per_prompt" in r:
                return np.array(r["per_prompt"]["committed"]), np.array(r["per_prompt"]["rounds"])
        return None

    first, second = counts(a), counts(b)
    if first is None or second is None or len(first[0]) != len(second[0]):
        return None
    def gap(prompts):  # τ is committed tokens over rounds, summed over the prompts drawn
        return (first[0][prompts].sum(-1) / first[1][prompts].sum(-1)
                - second[0][prompts].sum(-1) / second[1][prompts].sum(-1))

    picks = np.random.default_rng(seed).integers(len(first[0]), size=(draws, len(first[0])))
    low, high = np.percentile(gap(picks), [2.5, 97.5])
    return float(gap(np.arange(len(first[0])))), float(low), float(high)


def slope_per_doubling(points: list[dict], key=lambda p: p["mean"]) -> float:
    """The least-squares slope of ``key(point)`` against log2 of the answer tokens trained on."""
    return float(np.polyfit([math.log2(p["tokens"]) for p in points], [key(p) for p in points], 1)[0])
