"""The prompt pools that ship with Python and with PyPI packages: their form, their order, and their split."""

import ast
import re

import pytest

from dspark.data import load_code_prompts, load_math_prompts, load_prompts

PREFIX = "Complete this Python function.\n\n"


@pytest.mark.parametrize("series", [1, 2])
def test_code_prompts_are_stdlib_stubs_worded_as_humaneval_and_never_an_evaluation_prompt(series):
    prompts = load_code_prompts(series=series)
    # About 1,870 and 1,490 on Python 3.11.
    assert len(prompts) > 1000
    assert len(set(prompts)) == len(prompts)
    assert not set(prompts) & {p.text for p in load_prompts("code")}
    assert load_code_prompts(5, series=series) == prompts[:5]  # a limit keeps a prefix of one fixed order
    assert load_code_prompts(5, seed=1, series=series) != prompts[:5]
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


def test_the_two_series_of_code_prompts_share_no_prompt():
    assert not set(load_code_prompts(series=1)) & set(load_code_prompts(series=2))


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
