"""Matplotlib set-up and saving, shared by the sections that draw figures."""

from __future__ import annotations

from pathlib import Path


def pyplot():
    """matplotlib.pyplot on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig, figures: Path, name: str) -> None:
    """Lay out ``fig``, write it to ``figures/name`` and close it."""
    figures.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(figures / name, dpi=120)
    pyplot().close(fig)
