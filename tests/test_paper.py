"""paper/dspark.md is exactly what paper/build.py makes of benchmarks/results: no number typed by hand."""

from pathlib import Path

from paper.build import build

ROOT = Path(__file__).resolve().parents[1]


def test_paper_text_is_generated_from_the_results(tmp_path, monkeypatch):
    import paper.build as builder

    monkeypatch.setattr(builder, "PAPER", tmp_path)  # figures go to a scratch folder
    committed = (ROOT / "paper" / "dspark.md").read_text(encoding="utf-8")
    assert build() == committed, "paper/dspark.md is stale or edited by hand: run python -m paper.build"
