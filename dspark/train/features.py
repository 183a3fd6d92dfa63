"""Where a training step reads the target's hidden states (its taps and final-normed hidden state) from.

:class:`OnlineFeatures` runs the target in the training process; :class:`OfflineFeatures` reads one
safetensors file per sample, written by :func:`write_offline_features` (``hidden_states [seq, taps + 1, H]``
and ``token_ids``, the layout of the speculators tool; the last slice is the target's final-normed hidden
state), or computes a missing one with the target it is given; :class:`KeyedFeatures` routes samples of
several corpora to their sources by key.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch

from dspark._checks import all_finite, check_tensor
from dspark.drafter import DSparkDrafter
from dspark.train.samples import Sample


class FeatureSource:
    """Gives ``(taps [S, taps·H], final_hidden [S, H])`` of a sample's tokens under the target.

    The trainer needs only :meth:`features` (any object with it will do, as
    :class:`dspark.train.streaming.StreamedFeatures` is); it calls :meth:`prefetch` with a step's samples before
    reading them where a source has one."""

    def features(self, index: int, sample: Sample) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def prefetch(self, items: list[tuple[int, Sample]]) -> None:
        """Get ready to read the ``(index, sample)`` pairs of one step (nothing to do for most sources)."""


class OnlineFeatures(FeatureSource):
    """Runs the target in the training process (nothing on disk)."""

    def __init__(self, target):
        self.target = target

    @torch.no_grad()
    def features(self, index, sample):
        return target_features(self.target, sample.token_ids)


@torch.no_grad()
def target_features(target, token_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One full forward of the target over ``token_ids [S]``: taps ``[S, taps·H]`` and final hidden ``[S, H]``."""
    state = target.new_state(1)
    ids = token_ids[None].to(target.device)
    positions = torch.arange(ids.shape[1], device=target.device)[None]
    step = target.forward(state, ids, positions, torch.ones_like(ids, dtype=torch.bool))
    return step.taps[0].cpu(), step.hidden[0].cpu()


@torch.no_grad()
def teacher_forced_tokens(drafter: DSparkDrafter, token_ids: torch.Tensor, taps: torch.Tensor, anchors: torch.Tensor,
                          previous: torch.Tensor) -> torch.Tensor:
    """The block teacher forcing scores highest at each anchor: what training's evaluation counts as correct.

    Args:
        token_ids: ``[S]`` one sequence; taps: ``[S, taps·H]`` its target features (:func:`target_features`).
        anchors: ``[N]`` anchor positions; previous: ``[N, γ − 1]`` the tokens fed to slots 2…γ as the ones
            before them (the ground truth in training; a decoder's own drafts to replay what it drafted).

    Returns:
        ``[N, γ]`` the argmax of every slot's draft logits, as target ids.
    """
    check_tensor("anchors", anchors, ndim=1, integer=True)
    if anchors.numel() and (int(anchors.min()) < 0 or int(anchors.max()) >= token_ids.shape[0]):
        raise ValueError(f"anchors must lie in [0, {token_ids.shape[0]}), got range "
                         f"[{int(anchors.min())}, {int(anchors.max())}]")
    dtype = next(drafter.parameters()).dtype
    logits, _ = drafter.training_logits(token_ids[anchors][None], anchors[None], taps[None].to(dtype), previous[None])
    best = logits[0].argmax(-1)
    return drafter.draft_to_target[best] if drafter.reduced_vocab else best


def write_offline_features(target, samples: list[Sample], directory: str | os.PathLike, *,
                           dtype: torch.dtype = torch.bfloat16, progress: bool = True) -> Path:
    """One ``{index:06d}.safetensors`` per sample; resumable: files already present and valid are kept."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    source = OfflineFeatures(directory, target.tap_layers, target.hidden_size)
    iterator = range(len(samples))
    if progress:
        from tqdm.auto import tqdm

        iterator = tqdm(iterator, desc="target features", unit="seq")
    for i in iterator:
        path = directory / f"{i:06d}.safetensors"
        if path.exists():
            try:
                source.read(path, samples[i])
                continue
            except Exception:  # unreadable, truncated or for other tokens: compute it again
                path.unlink()
        write_feature_file(path, samples[i], *target_features(target, samples[i].token_ids), dtype=dtype)
    return directory


def write_feature_file(path: str | os.PathLike, sample: Sample, taps: torch.Tensor, hidden: torch.Tensor, *,
                       dtype: torch.dtype = torch.bfloat16) -> None:
    """One sample in :class:`OfflineFeatures`' layout, atomically: ``hidden_states [S, taps + 1, H]`` (the taps
    ``[S, taps·H]`` then the final hidden state ``[S, H]``), ``token_ids`` and ``loss_mask``."""
    import safetensors.torch

    from dspark.io import atomic_write

    stacked = torch.cat([taps.reshape(taps.shape[0], -1, hidden.shape[-1]), hidden[:, None]], 1)
    tensors = {"hidden_states": stacked.to(dtype).contiguous(), "token_ids": sample.token_ids.contiguous(),
               "loss_mask": sample.loss_mask.to(torch.uint8).contiguous()}
    atomic_write(path, lambda tmp: safetensors.torch.save_file(tensors, tmp))


class OfflineFeatures(FeatureSource):
    """Reads what :func:`write_offline_features` wrote, checking token ids, shapes and finiteness.

    Given a ``target``, a sample whose file is missing has its features computed by it when first read, stored
    in ``dtype`` and read back, so they are the same whether computed now or by an earlier run: a run over a large
    corpus pays the target's forward only for the samples it reads. :meth:`prefetch` computes a step's missing
    samples in one padded forward, as :func:`dspark.train.answers.rebuild_corpus` computes a batch (a step of four costs
    per token what the rebuild's batches of 32 do: ``benchmarks/bench_corpus.py --lazy``). ``built`` and
    ``build_seconds`` count that work.
    """

    def __init__(self, directory: str | os.PathLike, tap_layers: list[int], hidden_size: int, *, target=None,
                 dtype: torch.dtype = torch.bfloat16):
        self.directory = Path(directory)
        self.num_taps, self.hidden_size = len(tap_layers), hidden_size
        if target is not None and (list(target.tap_layers) != list(tap_layers) or target.hidden_size != hidden_size):
            raise ValueError(f"the target taps layers {list(target.tap_layers)} of width {target.hidden_size}, the "
                             f"features layers {list(tap_layers)} of width {hidden_size}")
        self.target, self.dtype = target, dtype
        self.built, self.build_seconds = 0, 0.0

    def read(self, path: Path, sample: Sample):
        import safetensors.torch

        data = safetensors.torch.load_file(path)
        states, ids = data.get("hidden_states"), data.get("token_ids")
        if states is None or ids is None:
            raise ValueError(f"{path} lacks hidden_states or token_ids")
        if not torch.equal(ids, sample.token_ids):
            raise ValueError(f"{path} holds features of different tokens than sample {path.stem}")
        expected = (ids.shape[0], self.num_taps + 1, self.hidden_size)
        if tuple(states.shape) != expected:
            raise ValueError(f"{path}: hidden_states has shape {tuple(states.shape)}, expected {expected}")
        if not all_finite(states):
            raise ValueError(f"{path}: hidden_states contains NaN or Inf")
        states = states.float()
        return states[:, : self.num_taps].reshape(ids.shape[0], -1), states[:, -1]

    def _path(self, index: int) -> Path:
        return self.directory / f"{index:06d}.safetensors"

    @torch.no_grad()
    def prefetch(self, items: list[tuple[int, Sample]]) -> None:
        """Compute and store, in one padded forward of the target, the features of those ``(index, sample)`` pairs
        that are not on disk (nothing without a target)."""
        if self.target is None:
            return
        todo = {index: sample for index, sample in items if not self._path(index).exists()}
        if not todo:
            return
        start = time.perf_counter()
        self.directory.mkdir(parents=True, exist_ok=True)
        width = max(len(sample.token_ids) for sample in todo.values())
        ids = torch.zeros(len(todo), width, dtype=torch.long)
        valid = torch.zeros(len(todo), width, dtype=torch.bool)
        for row, sample in enumerate(todo.values()):
            ids[row, : len(sample.token_ids)] = sample.token_ids
            valid[row, : len(sample.token_ids)] = True
        taps, hidden = self.target.features(ids, valid)
        for row, (index, sample) in enumerate(todo.items()):
            n = len(sample.token_ids)
            write_feature_file(self._path(index), sample, taps[row, :n].cpu(), hidden[row, :n].cpu(), dtype=self.dtype)
        self.built += len(todo)
        self.build_seconds += time.perf_counter() - start

    def features(self, index, sample):
        self.prefetch([(index, sample)])
        return self.read(self._path(index), sample)


class KeyedFeatures(FeatureSource):
    """Features from several sources, told apart by key: ``sources`` maps a key offset to a source, and a sample
    keyed ``k`` reads key ``k - offset`` from the source with the largest offset not above ``k`` (so the samples
    of several corpora on disk, each keyed from 0, can train together)."""

    def __init__(self, sources: dict[int, FeatureSource]):
        if not sources or min(sources) != 0:
            raise ValueError(f"sources need one source at offset 0, got offsets {sorted(sources)}")
        self.sources = sources

    def _source(self, index: int) -> tuple[int, FeatureSource]:
        offset = max(o for o in self.sources if o <= index)
        return offset, self.sources[offset]

    def features(self, index, sample):
        offset, source = self._source(index)
        return source.features(index - offset, sample)

    def prefetch(self, items):
        by_source: dict[int, list[tuple[int, Sample]]] = {}
        for index, sample in items:
            offset, _ = self._source(index)
            by_source.setdefault(offset, []).append((index - offset, sample))
        for offset, share in by_source.items():
            self.sources[offset].prefetch(share)
