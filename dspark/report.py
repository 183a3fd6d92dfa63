"""Tables that read well in a terminal (``print``), in a notebook (``display``: HTML) and in pandas (``to_frame``)."""

from __future__ import annotations

import html


class Table:
    """Rows of dicts shown under chosen columns.

    Args:
        rows: one dict a row; a missing key shows as ``-``.
        columns: ``(key, header)`` pairs, in order.
        title: a line shown above the table.

    ``str(table)`` is plain text (floats to two decimals, lists of floats space-separated, NaN as ``-``);
    a notebook displays it as HTML through :meth:`_repr_html_`; :meth:`to_frame` gives a ``pandas.DataFrame``
    of the raw values, for a researcher who wants to sort, filter or plot them.
    """

    def __init__(self, rows: list[dict], columns: list[tuple[str, str]], title: str | None = None):
        self.rows, self.columns, self.title = list(rows), list(columns), title

    def __str__(self) -> str:
        cells = [[header for _, header in self.columns]] + [[_fmt(row.get(key)) for key, _ in self.columns]
                                                            for row in self.rows]
        widths = [max(len(r[i]) for r in cells) for i in range(len(self.columns))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
        lines.insert(1, "  ".join("-" * w for w in widths))
        return "\n".join(([self.title] if self.title else []) + lines)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{html.escape(header)}</th>" for _, header in self.columns)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(_fmt(row.get(key)))}</td>" for key, _ in self.columns)
                       + "</tr>" for row in self.rows)
        caption = f"<caption>{html.escape(self.title)}</caption>" if self.title else ""
        return f"<table>{caption}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"

    def to_frame(self):
        """A ``pandas.DataFrame`` with one column per table column (headers as names), raw values."""
        try:
            import pandas as pd
        except ImportError as error:
            raise ImportError("to_frame needs pandas: pip install pandas") from error
        return pd.DataFrame([{header: row.get(key) for key, header in self.columns} for row in self.rows])


def format_table(rows: list[dict], columns: list[tuple[str, str]]) -> str:
    """A plain-text table; ``columns`` are (key, header) pairs."""
    return str(Table(rows, columns))


def _fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.2f}" if value == value else "-"
    if isinstance(value, list):
        return " ".join(f"{v:.2f}" if v == v else "-" for v in value)
    return str(value)
