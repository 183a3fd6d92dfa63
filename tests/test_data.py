"""The prompt pools that ship with Python and with PyPI packages: their form, their order, and their split."""

import ast
import re

import pytest

from dspark.data import load_code_prompts, load_math_prompts, load_prompts

PREFIX = "Complete this Python function.\n\n"


def test_code_prompts_are_stdlib_stubs_worded_as_humaneval_and_never_an_evaluation_prompt():
    prompts = load_code_prompts()
    assert len(prompts) > 1000  # about 1,870 on Python 3.11: the training recipe asks for 1,600
    assert len(set(prompts)) == len(prompts)
    assert not set(prompts) & {p.text for p in load_prompts("code")}
    assert load_code_prompts(5) == prompts[:5]  # a limit keeps a prefix of one fixed order
    assert load_code_prompts(5, seed=1) != prompts[:5]
    for prompt in prompts[:50]:
        assert prompt.startswith(PREFIX)
        stub = prompt[len(PREFIX):]
        # A signature and docstring only: it parses once a body is added, and holds no statement but the docstring.
        (function,) = ast.parse(stub + "    pass\n").body
        assert isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef))
        assert ast.get_docstring(function) is not None and len(function.body) == 2


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
