"""Static shapes for CUDA graphs: the same tokens as dynamic shapes, nothing a capture cannot hold, no silent mode.

The capture itself needs a GPU (``tests/gpu/test_gpu_graphs.py``). What makes a capture valid is checked here, on
the eager path that runs the very same code: no read of a device value and no copy from the host inside the two
captured functions, and the same operations on the same shapes every round.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from benchmarks.host_trace import HostTrace
from dspark.runtime.decoding import SamplingConfig, SpeculativeDecoder
from dspark.runtime.graphs import batch_buckets, resolve_mode
from dspark.scheduler import FixedLength, Threshold
from tests.e2e.conftest import drafter_for, eagle3_for, tiny_target

PROMPTS = [[1, 2, 3], [4, 5, 6, 7], [9]]


def _decode(target, drafter, config, graphs, backend="torch", max_batch=None):
    decoder = SpeculativeDecoder(target, drafter, config, scheduler=Threshold(0.5), backend=backend,
                                 fixed_width=True, graphs=graphs)
    return decoder, decoder.start(PROMPTS, max_batch).run()


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("max_batch", [None, 2])
def test_static_shapes_commit_the_tokens_of_dynamic_shapes(temperature, max_batch):
    """Three requests run in a bucket of four (one padding row), or two at a time with requests leaving and joining
    the static cache: tokens and acceptance equal those of the dynamic fixed-width path. Sampled tokens compare
    exactly too: both paths take the same draws, and in fp32 this target's distributions do not differ enough
    between the two attention widths to move a draw across a token boundary (the test would show it if they did)."""
    target = tiny_target(vocab=64)
    drafter = drafter_for(target)
    config = SamplingConfig(max_new_tokens=24, temperature=temperature, eos_token_id=63, seed=3)
    _, dynamic = _decode(target, drafter, config, "off", max_batch=max_batch)
    decoder, static = _decode(target, drafter, config, "eager", max_batch=max_batch)
    assert decoder.graph_mode == "eager" and decoder.static.captures == 0
    assert static.tokens == dynamic.tokens
    assert torch.equal(torch.as_tensor(static.stats.accepted), torch.as_tensor(dynamic.stats.accepted))


def test_static_shapes_on_the_fused_kernels_commit_the_tokens_of_dynamic_shapes():
    target = tiny_target(vocab=64)
    drafter = drafter_for(target)
    config = SamplingConfig(max_new_tokens=12, temperature=1.0, eos_token_id=63, seed=5)
    _, dynamic = _decode(target, drafter, config, "off", backend="triton")
    _, static = _decode(target, drafter, config, "eager", backend="triton")
    assert static.tokens == dynamic.tokens


class _OpShapes(TorchDispatchMode):
    """Every operation with the shapes and dtypes of its tensor arguments, in order."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        flat, _ = tree_flatten((args, kwargs or {}))
        self.ops.append((str(func), tuple((tuple(a.shape), a.dtype) for a in flat if isinstance(a, torch.Tensor))))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("backend, sampling", [("torch", dict(temperature=0.0)), ("torch", dict(temperature=1.0)),
                                               ("torch", dict(temperature=0.8, top_k=8, top_p=0.9)),
                                               ("triton", dict(temperature=0.8, top_k=8, top_p=0.9))])
def test_the_captured_functions_run_the_same_shapes_every_round_and_never_wait_for_the_device(backend, sampling):
    """What a CUDA graph replays must not change between rounds: over rounds whose context lengths and accepted
    counts differ, the draft and verify functions of a bucket run the same operations on the same shapes, read no
    device value and copy nothing from the host. The first round is left out of the shape comparison: the fused
    kernels' launchers build their plans (constant tensors) at their first call, as the warm-up before a capture
    does."""
    target = tiny_target(vocab=64)
    drafter = drafter_for(target)
    config = SamplingConfig(max_new_tokens=30, eos_token_id=63, seed=2, **sampling)
    trace = HostTrace([target.model, drafter])
    with trace:
        decoder = SpeculativeDecoder(target, drafter, config, scheduler=Threshold(0.5), backend=backend,
                                     graphs="eager")
        decoder.start(PROMPTS)
        static = decoder.static
        recorded = {"draft": [], "verify": []}
        for name in recorded:
            runner = getattr(static, f"_{name}")
            original = runner.fn

            def traced(bucket, _name=name, _original=original):
                with trace.phase(f"{_name}_graph"), _OpShapes() as shapes:
                    out = _original(bucket)
                recorded[_name].append(shapes.ops)
                return out
            runner.fn = traced
        lengths = []
        for _ in range(5):
            lengths.append(decoder.cache.lengths.tolist())
            decoder.step()
    assert len(set(map(tuple, lengths[1:]))) == 4, "the rounds must differ in context lengths"
    for name, rounds in recorded.items():
        assert len(rounds) == 5 and all(ops == rounds[1] for ops in rounds[2:]), f"{name} shapes changed between rounds"
        counts = trace.counts[f"{name}_graph"]
        assert counts["torch_ops"] > 0
        assert counts["host_syncs"] == counts["host_to_device"] == counts["host_to_device_async"] == 0, counts


def test_a_static_round_waits_for_the_device_once():
    target = tiny_target(vocab=64)
    drafter = drafter_for(target)
    trace = HostTrace([target.model, drafter])
    config = SamplingConfig(max_new_tokens=40, temperature=1.0, seed=1, eos_token_id=63)
    with trace:
        decoder = SpeculativeDecoder(target, drafter, config, scheduler=FixedLength(3), backend="torch",
                                     graphs="eager")
        decoder.start(PROMPTS[:2])
        decoder.step()
        trace.reset()
        for _ in range(3):
            decoder.step()
    assert sum(counter["host_syncs"] for counter in trace.counts.values()) == 3, trace.sync_sites
    assert sum(counter["host_to_device"] for counter in trace.counts.values()) == 0


def test_modes_are_chosen_out_loud():
    """No silent fallback: captured without CUDA is an error, auto says what it chose, off keeps dynamic shapes."""
    target = tiny_target(vocab=64)
    drafter = drafter_for(target)
    with pytest.raises(ValueError, match="needs a CUDA device"):
        SpeculativeDecoder(target, drafter, graphs="captured")
    with pytest.raises(ValueError, match="graphs must be one of"):
        SpeculativeDecoder(target, drafter, graphs="on")
    with pytest.raises(ValueError, match="needs a DSparkDrafter"):
        SpeculativeDecoder(target, eagle3_for(target), graphs="eager")
    assert SpeculativeDecoder(target, drafter, graphs="auto").graph_mode == "eager"
    assert resolve_mode("auto", torch.device("cpu")) == "eager"
    off = SpeculativeDecoder(target, drafter)
    assert off.graph_mode == "off" and not off.fixed_width
    assert SpeculativeDecoder(target, drafter, graphs="eager").fixed_width


def test_batch_buckets_are_powers_of_two_up_to_the_largest_batch():
    assert batch_buckets(1) == (1,)
    assert batch_buckets(6) == (1, 2, 4, 6)
    assert batch_buckets(8) == (1, 2, 4, 8)
    with pytest.raises(ValueError, match="max_batch"):
        batch_buckets(0)


def test_a_second_decode_of_the_same_size_reuses_the_static_round():
    target = tiny_target(vocab=64)
    drafter = drafter_for(target)
    config = SamplingConfig(max_new_tokens=8, temperature=0.0, eos_token_id=63)
    decoder = SpeculativeDecoder(target, drafter, config, backend="torch", graphs="eager")
    first = decoder.start(PROMPTS).run()
    static = decoder.static
    second = decoder.start(PROMPTS).run()
    assert decoder.static is static and second.tokens == first.tokens
    decoder.start([[1] * 40])  # a longer prompt needs a larger cache
    assert decoder.static is not static and decoder.cache.capacity == 48
