"""Plain-text tables for terminals and notebooks."""

from __future__ import annotations


def format_table(rows: list[dict], columns: list[tuple[str, str]]) -> str:
    """A plain-text table; ``columns`` are (key, header) pairs."""
    cells = [[header for _, header in columns]] + [[_fmt(row.get(key)) for key, _ in columns] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.2f}"
    if isinstance(value, list):
        return " ".join(f"{v:.2f}" if v == v else "-" for v in value)
    return str(value)
