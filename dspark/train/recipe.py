"""Training recipes as data: one JSON file holds a drafter's whole training schedule.

A recipe names the settings its phases share (the objective and loss weights, the drafter's shape, the
ShareGPT corpus, its held-out split and answers archive, anchors, batch and precision: the keyword arguments
of :func:`dspark.train.pipeline.train_default_drafter`), the extra prompt pools it draws on (each a kind of
source with its options and answers archive, :class:`dspark.train.pools.PoolSpec`), and its phases in order.
Each phase trains for ``steps`` at a peak learning rate ``lr`` (warm-up, then cosine) on the ShareGPT corpus
plus the pools it names, with how many of their prompts, continuing the drafter the phase before it wrote.
``arms`` are variants that run the first ``phases`` phases with other settings (another objective or loss mix,
or fewer steps in each), so baselines train on exactly the main arm's data::

    {"objective": "dspark", "num_draft_layers": 2, "answers": "smollm2_drafter.answers.npz", ...,
     "pools": {"code": {"source": "stdlib-code", "answers": "smollm2_drafter.code.answers.npz"},
               "math": {"source": "word-problems", "answers": "smollm2_drafter.math.answers.npz"}},
     "phases": [{"steps": 4000, "lr": 0.001},
                {"steps": 6000, "lr": 0.0003, "pools": {"code": 1867, "math": 4000}}],
     "arms": {"dflash": {"objective": "dflash", "phases": 1}}}

Paths (answers archives, a ``file`` pool's prompts) are relative to the recipe file. :func:`run_recipe` trains
the phases in turn, each but the last into a directory of its own beside the output
(``<output>-phases/phase01-steps4000``, …), and skips a phase whose directory already holds the drafter it
would write, so a schedule that was stopped resumes at its first unfinished phase (and that phase at its last
checkpoint). A recipe without ``phases`` is one phase.
"""

from __future__ import annotations

import inspect
import json
import os
from pathlib import Path

from dspark.train.pools import PoolSpec

# Settings a phase may set: how long and how fast it trains, and on which pools. The rest is the recipe's.
PHASE_SETTINGS = frozenset({"steps", "lr", "pools"})
# Settings the schedule itself decides, which a recipe file cannot set.
SCHEDULED = frozenset({"continue_from", "output_dir", "work_dir", "progress"})


def _train_parameters() -> set[str]:
    from dspark.train.pipeline import train_default_drafter

    return set(inspect.signature(train_default_drafter).parameters)


def _steps(settings: dict) -> int:
    """A phase's steps: its own, or train_default_drafter's default."""
    from dspark.train.pipeline import train_default_drafter

    return settings.get("steps", inspect.signature(train_default_drafter).parameters["steps"].default)


def load_recipe(path: str | os.PathLike, arm: str | None = None) -> list[dict]:
    """The keyword arguments of :func:`dspark.train.pipeline.train_default_drafter` for each phase of ``arm``
    (default: the recipe's main arm), without ``continue_from``. Raises ``ValueError`` for a recipe that
    cannot run: unknown settings, a phase naming a pool the recipe does not list, an unknown arm."""
    path = Path(path)
    recipe = json.loads(path.read_text(encoding="utf-8"))
    shared_keys = _train_parameters() - SCHEDULED - {"pools"}
    unknown = set(recipe) - shared_keys - {"pools", "phases", "arms"}
    if unknown:
        raise ValueError(f"{path}: unknown settings {sorted(unknown)}; allowed: {sorted(shared_keys)} and pools, "
                         f"phases, arms")
    relative = path.resolve().parent
    pools = {name: _pool_settings(path, name, settings, relative)
             for name, settings in recipe.get("pools", {}).items()}
    phases = recipe.get("phases") or [{}]
    arms = recipe.get("arms", {})
    overrides: dict = {}
    if arm is not None:
        if arm not in arms:
            raise ValueError(f"{path} has no arm {arm!r}; its arms: {', '.join(arms) or 'none'}")
        overrides = dict(arms[arm])
        count = overrides.pop("phases", len(phases))
        if not 1 <= count <= len(phases):
            raise ValueError(f"{path}: arm {arm!r} runs {count} phases, but the recipe has {len(phases)}")
        phases = phases[:count]
        unknown = set(overrides) - shared_keys - (PHASE_SETTINGS - {"pools"})
        if unknown:
            raise ValueError(f"{path}: arm {arm!r} sets unknown settings {sorted(unknown)}")
    shared = {k: v for k, v in recipe.items() if k not in ("pools", "phases", "arms")}
    if shared.get("answers") is not None:
        shared["answers"] = str(relative / shared["answers"])
    expanded = []
    for index, phase in enumerate(phases, 1):
        unknown = set(phase) - PHASE_SETTINGS
        if unknown:
            raise ValueError(f"{path}: phase {index} sets {sorted(unknown)}; a phase sets only "
                             f"{', '.join(sorted(PHASE_SETTINGS))}")
        settings = dict(shared) | {k: v for k, v in phase.items() if k != "pools"} | overrides
        counts = phase.get("pools", {})
        unlisted = sorted(set(counts) - set(pools))
        if unlisted:
            raise ValueError(f"{path}: phase {index} draws on pools {unlisted}, which the recipe's pools do not list")
        # In the order the recipe lists its pools, whichever order a phase names them in: the order in which
        # pools join a run's data decides its shuffle.
        settings["pools"] = {name: {**pools[name], "count": counts[name]} for name in pools if name in counts}
        for name, pool in settings["pools"].items():
            PoolSpec.from_dict(name, pool)  # a count it cannot take is refused before training
        expanded.append(settings)
    return expanded


def recipe_pool(path: str | os.PathLike, name: str) -> PoolSpec:
    """The pool ``name`` of the recipe at ``path`` (its count 0: no phase's); ``ValueError`` if it has none."""
    path = Path(path)
    pools = json.loads(path.read_text(encoding="utf-8")).get("pools", {})
    if name not in pools:
        raise ValueError(f"{path} has no pool {name!r}; its pools: {', '.join(pools) or 'none'}")
    return PoolSpec.from_dict(name, _pool_settings(path, name, pools[name], path.resolve().parent))


def _pool_settings(path: Path, name: str, settings, relative: Path) -> dict:
    """A recipe's pool with its paths made absolute; ``ValueError`` for one :class:`PoolSpec` would refuse."""
    if not isinstance(settings, dict):
        raise ValueError(f"{path}: pool {name!r} must be an object with a source, such as "
                         f'{{"source": "stdlib-code", "answers": "code.answers.npz"}}')
    settings = {**settings, **{k: str(relative / settings[k]) for k in ("answers", "path") if settings.get(k)}}
    try:
        PoolSpec.from_dict(name, settings)
    except ValueError as error:
        raise ValueError(f"{path}: {error}") from None
    return settings


def phase_directories(output_dir: str | os.PathLike, phases: list[dict]) -> list[Path]:
    """Where each phase writes its drafter: the last into ``output_dir``, the others beside it."""
    output_dir = Path(output_dir)
    steps, directories = 0, []
    for index, phase in enumerate(phases, 1):
        steps += _steps(phase)
        directories.append(output_dir.with_name(f"{output_dir.name}-phases") / f"phase{index:02d}-steps{steps}")
    directories[-1] = output_dir
    return directories


def finished(directory: Path, settings: dict, parent: Path | None) -> bool:
    """Whether ``directory`` holds the drafter a phase with ``settings`` continuing ``parent`` writes."""
    from dspark.files.checkpoint import read_checkpoint_config

    if not (directory / "config.json").exists():
        return False
    recorded = read_checkpoint_config(directory).get("metadata", {}).get("run", {}).get("arguments", {})
    expected = {k: Path(v).name if k == "answers" and v is not None else v for k, v in settings.items()}
    expected["pools"] = [PoolSpec.from_dict(name, pool).record() for name, pool in settings["pools"].items()]
    expected["continue_from"] = None if parent is None else parent.name
    return all(recorded.get(k) == v for k, v in expected.items())


def run_recipe(path: str | os.PathLike, output_dir: str | os.PathLike, *, arm: str | None = None,
               overrides: dict | None = None, work_dir: str | os.PathLike | None = None,
               progress: bool = True) -> Path:
    """Train every phase of the recipe at ``path`` (its ``arm``, with ``overrides`` applied to every phase).

    Phases whose drafter is already written are skipped, and said so; intermediate phases skip STS calibration
    (only the last drafter decodes). ``overrides`` may set ``continue_from`` (the drafter the first phase
    continues) and, for a recipe of one phase, ``steps``. Returns the final drafter's directory, ``output_dir``.
    """
    from dspark.train.pipeline import train_default_drafter

    overrides = dict(overrides or {})
    parent = overrides.pop("continue_from", None)
    parent = None if parent is None else Path(parent)
    phases = load_recipe(path, arm)
    if "steps" in overrides and len(phases) > 1:
        raise ValueError(f"{path} has {len(phases)} phases, each with its own steps: edit the phases, or train one "
                         f"phase with a recipe of its own")
    phases = [settings | overrides for settings in phases]
    directories = phase_directories(output_dir, phases)
    for index, (settings, directory) in enumerate(zip(phases, directories), 1):
        last = index == len(phases)
        settings = settings | ({} if last else {"calibrate": False})
        where = f"phase {index}/{len(phases)} ({_steps(settings):,} steps)"
        if finished(directory, settings, parent):
            print(f"{where}: already trained in {directory}, skipped", flush=True)
        else:
            print(f"{where}: training into {directory}", flush=True)
            train_default_drafter(directory, continue_from=parent, work_dir=work_dir, progress=progress, **settings)
        parent = directory
    return Path(output_dir)
