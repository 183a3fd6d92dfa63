"""paper/dspark.md is exactly what paper/build.py makes of benchmarks/results: no number typed by hand."""

import re
from pathlib import Path

import paper.build as builder

ROOT = Path(__file__).resolve().parents[1]
# Standalone numbers: not part of a word, an identifier, a version string, a decimal or a "§4.3" reference.
NUMBER = re.compile(r"(?<![\w.§])\d+(?:\.\d+)?(?![\w.])")
# Section, figure, slot and position numbers, γ and layer counts, "T = 0/1": structure, not measurements.
STRUCTURAL = {str(i) for i in range(17)}


def test_paper_text_is_generated_from_the_results(tmp_path, monkeypatch):
    monkeypatch.setattr(builder, "PAPER", tmp_path)  # figures go to a scratch folder
    committed = (ROOT / "paper" / "dspark.md").read_text(encoding="utf-8")
    assert builder.build() == committed, "paper/dspark.md is stale or edited by hand: run python -m paper.build"


def test_every_number_in_the_paper_comes_from_a_results_file_or_the_paper(tmp_path, monkeypatch):
    monkeypatch.setattr(builder, "PAPER", tmp_path)
    text = builder.build()
    stray = sorted({n for n in NUMBER.findall(text) if n not in builder.printed and n not in STRUCTURAL})
    assert not stray, f"numbers in paper/dspark.md from neither a results file nor the DSpark paper: {stray}"
    assert builder.quoted, "the paper's own numbers must be quoted beside ours"


def test_the_provenance_check_catches_a_typed_number(tmp_path, monkeypatch):
    monkeypatch.setattr(builder, "PAPER", tmp_path)
    text = builder.build() + "\nA speedup of 3.14× that nobody measured.\n"
    assert "3.14" in {n for n in NUMBER.findall(text) if n not in builder.printed and n not in STRUCTURAL}
