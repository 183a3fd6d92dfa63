"""Drafter checkpoints: ``config.json`` + ``model.safetensors``, written atomically, loaded without pickle.

The frozen embedding and LM head are copies of the target's, so by default they are not stored: a
checkpoint of a drafter for SmolLM2 then weighs a few MB instead of hundreds, and
:func:`load_drafter` restores them from the target. ``dspark.export`` writes the full speculators layout
that serving engines load.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch

from dspark.config import DSparkConfig
from dspark.drafter import DSparkDrafter
from dspark.io import atomic_directory, restore_interrupted

FORMAT = "dspark-drafter/1"
SHARED = ("embed_tokens.weight", "lm_head.weight")


def save_drafter(drafter: DSparkDrafter, directory: str | os.PathLike, *, include_shared: bool = False,
                 dtype: torch.dtype | None = None, metadata: dict | None = None) -> Path:
    """Write ``directory/{config.json, model.safetensors}`` atomically (a temporary folder, then a rename).

    Args:
        include_shared: also store the frozen embedding and LM head.
        dtype: cast floating tensors (e.g. ``torch.bfloat16`` to halve the size).
        metadata: JSON-serialisable notes stored in ``config.json`` (training recipe, metrics).
    """
    with atomic_directory(directory) as tmp:
        write_drafter_files(drafter, tmp, include_shared=include_shared, dtype=dtype, metadata=metadata)
    return directory


def write_drafter_files(drafter: DSparkDrafter, directory: Path, *, include_shared: bool = False,
                        dtype: torch.dtype | None = None, metadata: dict | None = None,
                        state: dict[str, torch.Tensor] | None = None) -> None:
    """``config.json`` and ``model.safetensors`` into an existing (temporary) folder; ``config.json`` records the
    weights file's sha256, which :func:`load_drafter` checks.

    ``state``: the weights to write when they are not ``drafter.state_dict()`` (a sharded run's, gathered).
    """
    import safetensors.torch

    tensors = {}
    for name, value in (drafter.state_dict() if state is None else state).items():
        if name in SHARED and not include_shared:
            continue
        value = value.detach().cpu().contiguous()
        if dtype is not None and value.is_floating_point():
            value = value.to(dtype)
        tensors[name] = value
    safetensors.torch.save_file(tensors, directory / "model.safetensors")
    config = {"format": FORMAT, "architecture": getattr(drafter, "architecture", "dspark"),
              "dspark_config": drafter.config.to_dict(), "includes_shared": include_shared, "metadata": metadata or {},
              "sha256": _sha256(directory / "model.safetensors")}
    (directory / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 24), b""):
            digest.update(chunk)
    return digest.hexdigest()


def read_checkpoint_config(directory: str | os.PathLike) -> dict:
    restore_interrupted(directory)
    path = Path(directory) / "config.json"
    if not path.exists():
        raise FileNotFoundError(f"no config.json in {directory}")
    config = json.loads(path.read_text(encoding="utf-8"))
    if config.get("format") != FORMAT:
        raise ValueError(f"{path} is not a dspark drafter checkpoint (format {config.get('format')!r}); "
                         "dspark.load reads both dspark and speculators checkpoints")
    return config


def load_drafter(directory: str | os.PathLike, target=None, *, dtype: torch.dtype = torch.float32) -> DSparkDrafter:
    """Rebuild a drafter from :func:`save_drafter`'s output; ``target`` supplies the shared weights if absent.

    DSpark and DFlash checkpoints give a :class:`DSparkDrafter`, EAGLE-3 ones an
    :class:`dspark.eagle3.Eagle3Drafter`.
    """
    import safetensors
    import safetensors.torch

    meta = read_checkpoint_config(directory)
    config = DSparkConfig.from_dict(meta["dspark_config"])
    if target is not None and (config.vocab_size, config.hidden_size) != (target.vocab_size, target.hidden_size):
        raise ValueError(f"{directory} was trained for another target (vocabulary {config.vocab_size}, width "
                         f"{config.hidden_size}; this target has {target.vocab_size} and {target.hidden_size})")
    architecture = meta.get("architecture", "dspark")
    if architecture == "eagle3":
        from dspark.eagle3 import Eagle3Drafter

        drafter = Eagle3Drafter(config)
    elif architecture == "dspark":
        drafter = DSparkDrafter(config)
    else:
        raise ValueError(f"unknown drafter architecture {architecture!r} in {directory}")
    weights = Path(directory) / "model.safetensors"
    if meta.get("sha256") and _sha256(weights) != meta["sha256"]:  # checkpoints older than the digest have none
        raise ValueError(f"{weights} does not match the sha256 its config.json records: the file is corrupt or was "
                         "replaced; write the checkpoint again")
    try:
        tensors = safetensors.torch.load_file(weights)
    except (OSError, safetensors.SafetensorError) as error:
        raise ValueError(f"{weights} is not a readable safetensors file ({error}): truncated or corrupt") from error
    try:
        missing, unexpected = drafter.load_state_dict(tensors, strict=False)
    except RuntimeError as error:  # a tensor of another shape than config.json gives it
        raise ValueError(f"{weights} does not fit {Path(directory) / 'config.json'}: {error}") from error
    if unexpected:
        raise ValueError(f"{weights} has tensors this drafter does not: {sorted(unexpected)}")
    missing = set(missing) - set(SHARED)
    if missing:
        raise ValueError(f"{weights} lacks tensors: {sorted(missing)}")
    if not meta.get("includes_shared"):
        if target is None:
            raise ValueError("this checkpoint does not store the shared embedding and LM head: pass the target")
        drafter.load_target_embeddings(target.embed_weight(), target.lm_head_weight())
    drafter.metadata = meta.get("metadata", {})
    drafter.checkpoint_path = Path(directory)
    return drafter.to(dtype).eval()


def default_drafter_dir() -> Path:
    from dspark.runtime.target import cache_root

    return cache_root() / "drafters" / "smollm2-135m-instruct-dspark"


def shipped_drafter_dir() -> Path:
    """The DSpark drafter for the default target that the package ships (the twelve phases of the committed
    recipe, ``benchmarks/recipes/smollm2_drafter.json``)."""
    return Path(__file__).resolve().parents[1] / "assets" / "smollm2-135m-instruct-dspark"


def find_default_drafter(target) -> DSparkDrafter | None:
    """The trained DSpark drafter for the default target: one that ``python -m dspark train`` wrote to the
    cache (:func:`default_drafter_dir`) wins over the one the package ships; ``None`` if neither exists."""
    for directory in (default_drafter_dir(), shipped_drafter_dir()):
        if (directory / "model.safetensors").exists():
            return load_drafter(directory, target)
    return None
