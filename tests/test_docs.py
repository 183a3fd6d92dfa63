"""README.md and the guides: a short front door, links that resolve, and no number that a committed record
does not hold."""

import json
import re
from pathlib import Path

import pytest

import paper.build as builder
from dspark.train.answers import load_answers
from paper import common

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "benchmarks" / "README.md"]
# A number: digits with thousands separators, or plain digits, with an optional decimal part; not part of a word,
# an identifier, a version string or a "§4.3" reference, and not a "#48639" issue or "HOST:29500" port.
NUMBER = re.compile(r"(?<![\w.§,#:])(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?![\w.]|,\d)")
# Section, figure, slot and position numbers, γ and layer counts, "T = 0/1": structure, not measurements.
STRUCTURAL = {str(i) for i in range(17)}


def plain(number: str) -> str:
    return number.replace(",", "")


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> set[str]:
    """Every number a committed record holds, in the forms a page may print it: the results files, the recipe,
    the committed drafters' metadata, the answers archives (their manifests, prompt counts and answer tokens),
    and the paper that ``paper.build`` makes of them (its printed and quoted numbers). Floats count rounded to
    0 to 3 decimals, and byte counts in GiB and MiB to one decimal."""
    builder.PAPER = tmp_path_factory.mktemp("paper")  # figures go to a scratch folder
    paper = builder.build()
    texts = [p.read_text(encoding="utf-8") for p in (
        *(ROOT / "benchmarks" / "results").glob("*.json"), *(ROOT / "benchmarks" / "recipes").glob("*.json"),
        *(ROOT / "benchmarks" / "drafters").glob("*/config.json"), *(ROOT / "dspark" / "assets").glob("*/config.json"))]
    for archive in (ROOT / "benchmarks" / "recipes").glob("*.answers.npz"):
        answers = load_answers(archive)
        texts.append(f"{json.dumps(answers.manifest)} {len(answers.keys)} {answers.answer_tokens}")
    known = STRUCTURAL | {plain(n) for n in common.printed} | {plain(n) for n in NUMBER.findall(paper)}
    for value in re.findall(r"\d+(?:\.\d+)?", " ".join(texts)):
        known.add(value)
        number = float(value)
        known.update(f"{number:.{digits}f}" for digits in range(4))
        if number >= 2**20:
            known.update({f"{number / 2**30:.1f}", f"{number / 2**20:.1f}"})
    return known


def untraced(text: str, known: set[str]) -> list[str]:
    return sorted({plain(n) for n in NUMBER.findall(text)} - known)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_number_comes_from_a_committed_record(page, recorded):
    stray = untraced(page.read_text(encoding="utf-8"), recorded)
    assert not stray, f"{page.relative_to(ROOT)} prints numbers that no committed record holds: {stray}"


def test_the_check_catches_a_typed_number(recorded):
    assert untraced("A speedup of 3.1719× and 98,765 tokens that nobody measured.", recorded) == ["3.1719", "98765"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    text = page.read_text(encoding="utf-8")
    links = [target.split("#")[0] for target in re.findall(r"\]\(([^)\s]+)\)", text)
             if not target.startswith(("http://", "https://", "#"))]
    missing = [link for link in links if not (page.parent / link).exists()]
    assert not missing, f"{page.relative_to(ROOT)} links to missing files: {missing}"


def test_the_front_door_is_short():
    """README.md is what a newcomer reads first: what dspark is, the two commands, an example, training for their
    own model, the notebooks, the layout and the headline; detail lives in the guides."""
    assert len((ROOT / "README.md").read_text(encoding="utf-8").splitlines()) <= 220


def resolves(dotted: str) -> bool:
    """Whether ``dspark.a.b.c`` names a module or an attribute of one (a class's method counts)."""
    import importlib

    parts = dotted.split(".")
    for split in range(len(parts), 0, -1):
        try:
            target = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        try:
            for attribute in parts[split:]:
                target = getattr(target, attribute)
        except AttributeError:
            return False
        return True
    return False


@pytest.mark.parametrize("page", PAGES + [ROOT / "paper" / "method.md"], ids=lambda p: str(p.relative_to(ROOT)))
def test_every_named_dspark_object_exists(page):
    """A page that names ``dspark.x.y`` in code quotes names something a reader can import."""
    names = set(re.findall(r"`(dspark(?:\.\w+)+)", page.read_text(encoding="utf-8")))
    missing = sorted(name for name in names if not resolves(name))
    assert not missing, f"{page.relative_to(ROOT)} names what dspark does not have: {missing}"
