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


def test_math_prompts_are_distinct_varied_word_problems_and_never_an_evaluation_prompt():
    prompts = load_math_prompts()
    assert len(prompts) == len(set(prompts)) == 4000
    assert not set(prompts) & {p.text for p in load_prompts("math")}
    assert load_math_prompts(5) == prompts[:5]
    assert load_math_prompts(5, seed=1) != prompts[:5]
    # Questions as GSM8K words them: prose with numbers in it, ending in a question, no instruction around it.
    assert all(p.endswith("?") and re.search(r"\d", p) for p in prompts)
    # Many questions, not a few shapes repeated: with their numbers blanked, over half are still distinct.
    assert len({re.sub(r"\d+", "N", p) for p in prompts}) > 2000


def test_the_second_series_of_word_problems_has_other_shapes_and_leaves_the_first_unchanged():
    first, second = load_math_prompts(), load_math_prompts(series=2)
    assert len(second) == len(set(second)) == 2000
    assert not set(second) & ({p.text for p in load_prompts("math")} | set(first))
    assert load_math_prompts(5, series=2) == second[:5] and load_math_prompts(5, seed=1, series=2) != second[:5]
    assert all(p.endswith("?") and re.search(r"\d", p) for p in second)
    assert len({re.sub(r"\d+", "N", p) for p in second}) > len(second) // 2
    # Other shapes, not the first series' with other numbers: no blanked question is shared.
    assert not {re.sub(r"\d+", "N", p) for p in second} & {re.sub(r"\d+", "N", p) for p in first}
    with pytest.raises(ValueError, match="series must be one of"):
        load_math_prompts(series=4)


def test_the_third_series_of_word_problems_shares_no_shape_with_the_first_two():
    earlier = load_math_prompts() + load_math_prompts(series=2)
    third = load_math_prompts(series=3)
    assert len(third) == len(set(third)) == 2000
    assert not set(third) & ({p.text for p in load_prompts("math")} | set(earlier))
    assert load_math_prompts(5, series=3) == third[:5] and load_math_prompts(5, seed=1, series=3) != third[:5]
    assert all(p.endswith("?") and re.search(r"\d", p) for p in third)
    assert len({re.sub(r"\d+", "N", p) for p in third}) > len(third) // 2
    assert not {re.sub(r"\d+", "N", p) for p in third} & {re.sub(r"\d+", "N", p) for p in earlier}
