"""A training run's history: one row per step, with a table of its evaluations and a plot of its curves."""

from __future__ import annotations

import json
import os
from pathlib import Path


class History(list):
    """A training run's rows (one per step: loss parts, learning rate, answer tokens seen, seconds; evaluation
    steps add ``eval_tau_prob``, ``eval_accuracy`` and the held-out loss parts), as :meth:`Trainer.fit` returns it.

    It is a plain list of dicts (JSON as it is), with a table of the evaluations and a plot of the curves.
    """

    @classmethod
    def read(cls, path: str | os.PathLike) -> History:
        """The history a run wrote as JSON (``history.json`` in the run directory of ``train --target``)."""
        return cls(json.loads(Path(path).read_text(encoding="utf-8")))

    def evaluations(self) -> list[dict]:
        return [row for row in self if "eval_tau_prob" in row]

    def table(self):
        """The evaluation rows as a :class:`dspark.report.Table`."""
        from dspark.report import Table

        rows = [dict(row, acc1=row["eval_accuracy"][0] if row.get("eval_accuracy") else None)
                for row in self.evaluations()]
        return Table(rows, [("step", "step"), ("answer_tokens_seen", "answer tokens seen"),
                            ("eval_tau_prob", "held-out τ_prob"), ("acc1", "slot-1 accuracy"),
                            ("seconds", "seconds")])

    def _repr_html_(self) -> str:
        return self.table()._repr_html_()

    def plot(self, axes=None):
        """Training loss by step and held-out τ_prob by step, side by side (τ_prob alone for a history of evaluations
        only, such as a drafter's ``curve``); returns the matplotlib axes."""
        import matplotlib.pyplot as plt

        trained = [row for row in self if "loss" in row]
        if axes is None:
            axes = plt.subplots(1, 2 if trained else 1, figsize=(9 if trained else 4.5, 3), squeeze=False)[1][0]
        if trained:
            axes[0].plot([row["step"] for row in trained], [row["loss"] for row in trained])
            axes[0].set(xlabel="step", ylabel="training loss", title="loss")
        evaluated = self.evaluations()
        axes[-1].plot([row["step"] for row in evaluated], [row["eval_tau_prob"] for row in evaluated], "o-")
        axes[-1].set(xlabel="step", ylabel="τ_prob", title="held-out τ_prob (expected tokens per round)")
        return axes
