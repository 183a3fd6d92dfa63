"""The prompt pools that ship with Python and with PyPI packages: their form, their order, and their split."""

import ast

from dspark.data import load_code_prompts, load_prompts

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
