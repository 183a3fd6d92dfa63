"""Interoperability with the speculators checkpoint format that vLLM serves (method.md §10).

:func:`export` writes ``config.json`` (the speculators keys, with ``transformer_layer_config`` describing the
draft layers) and ``model.safetensors`` (speculators tensor names, which are dspark's own, plus ``d2t``
offsets and the ``t2d`` mask for a reduced vocabulary). :func:`load` reads that format back, DSpark or
DFlash, and dspark's own training checkpoints too, and refuses with a clear error what a dspark drafter
cannot represent.

Traps the format has: ``aux_hidden_state_layer_ids`` counts layer *boundaries* from 1 (HF's
``hidden_states`` index: 0 is the embedding output, i + 1 the output of layer i), so dspark's tap i is
written as i + 1; ``sample_from_anchor`` is always written out, since its default differs between DFlash
and DSpark; the proposal's ``speculative_tokens`` equals the block size when sampling from the anchor.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import torch

from dspark.config import DSparkConfig
from dspark.drafter import DSparkDrafter
from dspark.io import atomic_directory
from dspark.vocab import d2t_offsets, t2d_mask

SPECULATORS_VERSION = "0.9.0"  # the speculators release whose config classes the tests validate against
SERVED_MARKOV_TYPES = ("vanilla",)  # vLLM's DSpark loader serves vanilla Markov heads only


def speculators_config(drafter: DSparkDrafter, verifier_name_or_path: str, verifier_architectures: list[str],
                       dtype: torch.dtype = torch.bfloat16) -> dict:
    """The ``config.json`` dictionary of an exported drafter."""
    c = drafter.config
    dspark_like = c.has_markov or c.enable_confidence_head
    model_type = "dspark" if dspark_like else "dflash"
    try:
        import transformers

        transformers_version = transformers.__version__
    except ImportError:
        transformers_version = None
    layer_config = {
        "model_type": "qwen3",
        "architectures": ["Qwen3ForCausalLM"],
        "vocab_size": c.vocab_size,
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_hidden_layers": c.num_draft_layers,
        "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads,
        "head_dim": c.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": c.rms_norm_eps,
        "rope_theta": c.rope_theta,
        "max_position_embeddings": c.max_position_embeddings,
        "attention_bias": False,
        "tie_word_embeddings": False,
        "use_sliding_window": False,
        "layer_types": ["full_attention"] * c.num_draft_layers,
    }
    return {
        "architectures": ["DSparkSpeculator" if dspark_like else "DFlashSpeculator"],
        "speculators_model_type": model_type,
        "speculators_version": SPECULATORS_VERSION,
        "transformers_version": transformers_version,
        "speculators_config": {
            "algorithm": model_type,
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": c.block_size,
                                  "verifier_accept_k": 1, "accept_tolerance": 0.0}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": verifier_name_or_path, "architectures": list(verifier_architectures)},
        },
        "transformer_layer_config": layer_config,
        "draft_vocab_size": c.draft_vocab_size,
        "block_size": c.block_size,
        "target_hidden_size": c.target_hidden_size,
        "aux_hidden_state_layer_ids": [tap + 1 for tap in c.target_layer_ids],
        "mask_token_id": c.mask_token_id,
        "sliding_window_non_causal": False,
        "sample_from_anchor": True,
        "markov_rank": c.markov_rank,
        "markov_head_type": c.markov_head_type,
        "enable_confidence_head": c.enable_confidence_head,
        "confidence_head_with_markov": c.confidence_head_with_markov,
        "torch_dtype": str(dtype).removeprefix("torch."),
        # dspark's own keys (ignored by other readers): what the speculators keys cannot say.
        "dspark": {"num_target_layers": c.num_target_layers, "sts_temperatures": drafter.sts_temperatures.tolist()},
    }


def verifier_owned(drafter: DSparkDrafter) -> set[str]:
    """The tensors a served drafter takes from its verifier, which speculators' own ``save_pretrained`` leaves out
    of a checkpoint: the embedding always, and the LM head unless the draft vocabulary is reduced (a reduced head
    is the verifier's rows of the draft vocabulary, stored as they are)."""
    return {"embed_tokens.weight"} | (set() if drafter.reduced_vocab else {"lm_head.weight"})


def export(drafter: DSparkDrafter, directory: str | os.PathLike, *, verifier_name_or_path: str,
           verifier_architectures: list[str], dtype: torch.dtype = torch.bfloat16) -> Path:
    """Write a speculators checkpoint of ``drafter`` to ``directory`` (atomically), without the tensors the
    serving engine takes from the verifier (:func:`verifier_owned`), as speculators writes its own.

    Args:
        verifier_name_or_path: the target as the serving engine should load it (a hub id or a path).
        verifier_architectures: the target's HF architectures, e.g. ``["LlamaForCausalLM"]``.
        dtype: dtype of the stored weights (``torch_dtype`` in config.json says the same).
    """
    import safetensors.torch

    c = drafter.config
    if not c.qk_norm:
        raise ValueError("speculators' DSpark/DFlash layers are Qwen3-style with per-head q/k norms; this drafter "
                         "has none (qk_norm=False) and cannot be served from that format")
    if c.markov_head_type not in SERVED_MARKOV_TYPES and c.has_markov:
        warnings.warn(f"markov_head_type={c.markov_head_type!r} is exported, but vLLM serves only "
                      f"{SERVED_MARKOV_TYPES} Markov heads: this checkpoint loads in dspark, not in vLLM",
                      UserWarning, stacklevel=2)
    tensors = {}
    for name, value in drafter.state_dict().items():
        if name in ("sts_temperatures", "draft_to_target") or name in verifier_owned(drafter):
            continue
        tensors[name] = value.detach().to("cpu", dtype).contiguous() if value.is_floating_point() else value
    if drafter.reduced_vocab:
        tensors["d2t"] = d2t_offsets(drafter.draft_to_target).cpu().long()
        tensors["t2d"] = t2d_mask(drafter.draft_to_target, c.vocab_size).cpu()
    config = speculators_config(drafter, verifier_name_or_path, verifier_architectures, dtype)
    with atomic_directory(directory) as tmp:
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
        safetensors.torch.save_file(tensors, tmp / "model.safetensors")
    return Path(directory)


def load(directory: str | os.PathLike, *, verifier=None, dtype: torch.dtype = torch.float32,
         num_target_layers: int | None = None) -> DSparkDrafter:
    """Load a drafter checkpoint, in dspark's own format (what ``python -m dspark train`` writes) or in the
    speculators format (DSpark or DFlash, written by :func:`export` or by speculators itself).

    Args:
        verifier: supplies the shared embedding and LM head when the checkpoint leaves them out (dspark's
            format always does; speculators leaves out what it takes from the verifier): a
            :class:`dspark.runtime.target.TargetModel`, a Hugging Face model directory, or a pair
            ``(embed_weight [V, H], lm_head_weight [V, H])``.
        num_target_layers: only for speculators checkpoints written elsewhere (dspark stores it); it bounds
            the taps, so without it the taps are checked against the smallest target they fit.

    The drafter's ``checkpoint_format`` says which format was read (``dspark`` or ``speculators``).
    """
    import safetensors.torch

    directory = Path(directory)
    path = directory / "config.json"
    if not path.exists():
        raise FileNotFoundError(f"no config.json in {directory}: not a drafter checkpoint")
    cfg = json.loads(path.read_text(encoding="utf-8"))
    from dspark.files.checkpoint import FORMAT, load_drafter

    if cfg.get("format") == FORMAT:
        drafter = load_drafter(directory, _verifier_target(verifier), dtype=dtype)
        drafter.checkpoint_format = "dspark"
        return drafter
    kind = cfg.get("speculators_model_type")
    if kind not in ("dspark", "dflash"):
        raise ValueError(f"{directory} is a {kind!r} speculators checkpoint; dspark loads 'dspark' and 'dflash'")
    if not cfg.get("sample_from_anchor", kind == "dspark"):
        raise ValueError(f"{directory} uses the z-lab DFlash layout (sample_from_anchor=False: slot k predicts its "
                         "own position and slot 0 is not a draft), which dspark's drafter does not implement")
    if cfg.get("sliding_window_non_causal"):
        raise ValueError("sliding-window draft attention is not implemented in dspark")
    layer = cfg["transformer_layer_config"]
    if layer.get("use_sliding_window") or "sliding_attention" in (layer.get("layer_types") or []):
        raise ValueError("draft layers with sliding-window attention are not implemented in dspark")
    own = cfg.get("dspark", {})
    tensors = safetensors.torch.load_file(directory / "model.safetensors")
    taps = [i - 1 for i in cfg["aux_hidden_state_layer_ids"]]
    heads = layer["num_attention_heads"]
    config = DSparkConfig(
        vocab_size=layer["vocab_size"],
        hidden_size=layer["hidden_size"],
        num_attention_heads=heads,
        num_key_value_heads=layer.get("num_key_value_heads", heads),
        head_dim=layer.get("head_dim") or layer["hidden_size"] // heads,
        intermediate_size=layer["intermediate_size"],
        num_target_layers=own.get("num_target_layers") or num_target_layers or max(taps) + 2,
        target_layer_ids=taps,
        mask_token_id=cfg["mask_token_id"],
        block_size=cfg["block_size"],
        num_draft_layers=layer["num_hidden_layers"],
        draft_vocab_size=cfg.get("draft_vocab_size") or layer["vocab_size"],
        markov_rank=cfg.get("markov_rank", 0) if kind == "dspark" else 0,
        markov_head_type=cfg.get("markov_head_type", "vanilla") if kind == "dspark" else "vanilla",
        enable_confidence_head=bool(cfg.get("enable_confidence_head", False)) and kind == "dspark",
        confidence_head_with_markov=bool(cfg.get("confidence_head_with_markov", False)) and kind == "dspark",
        confidence_head_bias="confidence_head.proj.bias" in tensors,  # DeepSeek-V4 heads have none
        qk_norm=True,
        rope_theta=_rope_theta(layer),
        rms_norm_eps=float(layer.get("rms_norm_eps", 1e-6)),
        max_position_embeddings=int(layer.get("max_position_embeddings", 4096)),
        target_hidden_size=cfg.get("target_hidden_size") or layer["hidden_size"],
    )
    drafter = DSparkDrafter(config)
    d2t = tensors.pop("d2t", None)
    tensors.pop("t2d", None)
    missing, unexpected = drafter.load_state_dict(tensors, strict=False)
    missing = set(missing) - {"sts_temperatures", "draft_to_target"}
    shared = {"embed_tokens.weight", "lm_head.weight"} & missing
    if unexpected or missing - shared:
        raise ValueError(f"{directory}: tensors missing {sorted(missing)}, unexpected {sorted(unexpected)}")
    if drafter.reduced_vocab:
        if d2t is None:
            raise ValueError(f"{directory}: a reduced draft vocabulary needs the d2t tensor")
        drafter.draft_to_target.copy_(d2t.long() + torch.arange(d2t.shape[0]))
    if shared:
        if verifier is None:
            raise ValueError(f"{directory} leaves out {sorted(shared)} (speculators takes them from the verifier): "
                             "pass verifier= (a TargetModel, a model directory, or (embed_weight, lm_head_weight))")
        embed, lm_head = _shared_weights(verifier)
        with torch.no_grad():
            if "embed_tokens.weight" in shared:
                drafter.embed_tokens.weight.copy_(embed)
            if "lm_head.weight" in shared:
                rows = drafter.draft_to_target if drafter.reduced_vocab else slice(None)
                drafter.lm_head.weight.copy_(lm_head[rows])
    if "sts_temperatures" in own:
        drafter.sts_temperatures.copy_(torch.tensor(own["sts_temperatures"]))
    drafter.checkpoint_format = "speculators"
    drafter.checkpoint_path = directory
    return drafter.to(dtype).eval()


def _rope_theta(layer: dict) -> float:
    """θ from ``rope_theta`` or (transformers 5) ``rope_parameters.rope_theta``; scaled RoPE is refused."""
    params = layer.get("rope_parameters") or {}
    scaling = layer.get("rope_scaling") or {}
    kind = params.get("rope_type") or params.get("type") or scaling.get("rope_type") or scaling.get("type")
    if kind not in (None, "default"):
        raise ValueError(f"the draft layers use RoPE type {kind!r}; dspark implements the default (unscaled) RoPE")
    theta = layer.get("rope_theta", params.get("rope_theta"))
    if theta is None:
        raise ValueError("transformer_layer_config gives no rope_theta (nor rope_parameters.rope_theta)")
    return float(theta)


def _verifier_target(verifier):
    """A TargetModel-like object with ``embed_weight()`` and ``lm_head_weight()``, or None."""
    if verifier is None or hasattr(verifier, "embed_weight"):
        return verifier
    from types import SimpleNamespace

    embed, lm_head = _shared_weights(verifier)
    return SimpleNamespace(embed_weight=lambda: embed, lm_head_weight=lambda: lm_head)


def _shared_weights(verifier) -> tuple[torch.Tensor, torch.Tensor]:
    if hasattr(verifier, "embed_weight"):
        return verifier.embed_weight().detach(), verifier.lm_head_weight().detach()
    if isinstance(verifier, (str, os.PathLike)):
        from dspark.runtime.target import load_target

        target = load_target(verifier)
        return target.embed_weight().detach(), target.lm_head_weight().detach()
    if isinstance(verifier, (tuple, list)) and len(verifier) == 2 and all(torch.is_tensor(t) for t in verifier):
        return verifier[0].detach(), verifier[1].detach()
    raise ValueError("verifier must be a TargetModel, a model directory, or a pair (embed_weight, lm_head_weight); "
                     f"got {type(verifier).__name__}")
