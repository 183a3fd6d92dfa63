"""What streaming features from an inference plane costs a training plane, against reading them from disk.

DSpark can train on hidden states streamed from target processes (:mod:`dspark.train.streaming`) instead of a
feature corpus written first. This measures, on this machine over loopback, with samples of the default target's
shape (``--tokens`` tokens, 5 taps and the final hidden state of width 576, bf16):

* **transport**: a producer process serving precomputed features as fast as the transport takes them, the
  consumer draining ``--samples`` of them: samples/s and MB/s of bf16 features delivered (the Mooncake transport
  carries them as fp32, twice the bytes on the wire), for the ``torch.distributed`` (gloo) and Mooncake
  transports;
* **training**: the shipped drafter's structure trained for ``--steps`` steps of the recipe's batch on those
  features, read from disk (:class:`dspark.train.features.OfflineFeatures`) or streamed by one producer process
  over Mooncake (:class:`dspark.train.streaming.StreamedFeatures`): seconds per step, and the fraction of each step
  spent waiting for features (``wait_fraction``: time inside the source's ``features`` call over the step's time).
  The same drafter, samples, steps and order in every arm; the first ``--warm-up`` steps are not counted. The
  ``torch.distributed`` transport is not trained on: it puts its producers in the default process group, which
  :class:`dspark.train.trainer.Trainer` takes for its data-parallel ranks, so the first all-reduce of a step waits
  for producers that never join it (the result says so).

The producer serves features it holds, so what is measured is the transport and the consumer, not a target's
forward. Both processes share this machine's cores; run it on an idle machine.

    python benchmarks/bench_streaming.py [--samples 64] [--tokens 256] [--steps 12] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.environment import write_result  # noqa: E402

HIDDEN, TAPS = 576, 5  # SmolLM2-135M: width, and the shipped drafter's tapped layers
SLOT_BYTES_MARGIN = 1 << 16
GLOO_TRAINING = ("the torch.distributed transport's producers share the default process group, which the Trainer "
                 "takes for its data-parallel ranks: its first all-reduce waits for producers that never join it")


def synthetic_features(index: int, tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(taps [S, taps·H], hidden [S, H])`` in bf16 for sample ``index``, the same in every process."""
    gen = torch.Generator().manual_seed(index)
    return (torch.randn(tokens, TAPS * HIDDEN, generator=gen).to(torch.bfloat16),
            torch.randn(tokens, HIDDEN, generator=gen).to(torch.bfloat16))


def sample_bytes(tokens: int) -> int:
    """A sample's features in bf16, as they are stored and computed."""
    return tokens * (TAPS + 1) * HIDDEN * 2


def wire_bytes(transport_name: str, tokens: int) -> int:
    """What one sample puts on the wire: the Mooncake transport sends fp32 (twice bf16), gloo the tensors as they
    are."""
    return sample_bytes(tokens) * (2 if transport_name == "mooncake" else 1)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def producer_main(transport_name: str, port: int, tokens: int, samples: int) -> None:
    """One producer (rank 1): serve every assigned index from features made up front."""
    torch.set_num_threads(1)
    from dspark.train.streaming import DistributedProducer, MooncakeProducer, serve

    held = {i: synthetic_features(i, tokens) for i in range(samples)}
    if transport_name == "gloo":
        torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=1, world_size=2)
        transport = DistributedProducer(0)
    else:
        store = torch.distributed.TCPStore("127.0.0.1", port, is_master=False)
        transport = MooncakeProducer(store, 1, wire_bytes(transport_name, tokens) + SLOT_BYTES_MARGIN)
    serve(transport, held.__getitem__)
    os._exit(0)


def open_stream(transport_name: str, indices: list[int], tokens: int, samples: int):
    """Start a producer process and return the consumer's :class:`FeatureStream` over ``indices``."""
    from dspark.train.streaming import DistributedConsumer, FeatureStream, MooncakeConsumer

    port = _free_port()
    process = multiprocessing.get_context("spawn").Process(target=producer_main,
                                                           args=(transport_name, port, tokens, samples))
    process.start()
    if transport_name == "gloo":
        torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=2)
        transport = DistributedConsumer([1])
    else:
        store = torch.distributed.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)
        transport = MooncakeConsumer(store, [1], wire_bytes(transport_name, tokens) + SLOT_BYTES_MARGIN, credit=2)
    return FeatureStream(transport, indices, credit=2, timeout=300), process


def close_stream(transport_name: str, process) -> None:
    process.join(timeout=60)
    if transport_name == "gloo" and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def transport_row(transport_name: str, samples: int, tokens: int) -> dict:
    stream, process = open_stream(transport_name, list(range(samples)), tokens, samples)
    iterator = iter(stream)
    next(iterator)  # the first sample waits for the producer to start: not counted
    start = time.perf_counter()
    received = 1 + sum(1 for _ in iterator)
    seconds = time.perf_counter() - start
    close_stream(transport_name, process)
    row = {"transport": transport_name, "samples": received - 1, "bytes_per_sample": sample_bytes(tokens),
           "wire_bytes_per_sample": wire_bytes(transport_name, tokens), "samples_per_s": (received - 1) / seconds,
           "mb_per_s": (received - 1) * sample_bytes(tokens) / seconds / 1e6,
           "wire_mb_per_s": (received - 1) * wire_bytes(transport_name, tokens) / seconds / 1e6}
    print(f"{transport_name}: {row['samples_per_s']:.1f} samples/s, {row['mb_per_s']:.0f} MB/s", flush=True)
    return row


class TimedSource:
    """A feature source that adds up the time its reader spends waiting in ``features``."""

    def __init__(self, source):
        self.source, self.waited = source, 0.0

    def features(self, index, sample):
        start = time.perf_counter()
        try:
            return self.source.features(index, sample)
        finally:
            self.waited += time.perf_counter() - start

    def __getattr__(self, name):
        return getattr(self.source, name)


def training_rows(arms: list[str], samples: int, tokens: int, steps: int, warm_up: int) -> list[dict]:
    """Seconds per training step and the fraction spent waiting for features, per feature source."""
    from dspark.drafter import DSparkDrafter
    from dspark.runtime.target import load_default_target
    from dspark.train.config import TrainConfig
    from dspark.train.features import OfflineFeatures, write_feature_file
    from dspark.train.samples import Sample
    from dspark.train.streaming import StreamedFeatures
    from dspark.train.trainer import Trainer

    target = load_default_target()
    gen = torch.Generator().manual_seed(0)
    items = []
    for _ in range(samples):
        ids = torch.randint(target.vocab_size, (tokens,), generator=gen)
        mask = torch.zeros(tokens, dtype=torch.bool)
        mask[tokens // 4:] = True  # a prompt, then the answer the drafter learns
        items.append(Sample(ids, mask))
    recipe = json.loads((Path(__file__).resolve().parent / "recipes" / "smollm2_drafter.json").read_text())
    rows = []
    with tempfile.TemporaryDirectory() as directory:
        for index, sample in enumerate(items):
            taps, hidden = synthetic_features(index, tokens)
            write_feature_file(Path(directory) / f"{index:06d}.safetensors", sample, taps, hidden)
        for arm in arms:
            torch.manual_seed(0)
            drafter = DSparkDrafter(target.drafter_config(
                block_size=recipe["block_size"], num_draft_layers=recipe["num_draft_layers"],
                markov_rank=recipe["markov_rank"], enable_confidence_head=True, confidence_head_with_markov=True,
                draft_vocab_size=recipe["draft_vocab_size"]))
            drafter.set_draft_vocab(torch.arange(recipe["draft_vocab_size"]))
            drafter.load_target_embeddings(target.embed_weight(), target.lm_head_weight())
            config = TrainConfig(steps=steps, sequences_per_step=recipe["sequences_per_step"],
                                 num_anchors=recipe["num_anchors"], eval_every=0)
            trainer = Trainer(drafter, target.lm_head_weight(), None, items, config)
            process = None
            if arm == "offline":
                source = OfflineFeatures(directory, target.tap_layers, target.hidden_size)
            else:
                stream, process = open_stream(arm, trainer.feature_order(), tokens, samples)
                source = StreamedFeatures(stream)
            trainer.source = timed = TimedSource(source)
            times, waits = [], []
            for step in range(steps):
                waited, start = timed.waited, time.perf_counter()
                trainer.train_step()
                if step >= warm_up:
                    times.append(time.perf_counter() - start)
                    waits.append(timed.waited - waited)
            if process is not None:
                close_stream(arm, process)
            row = {"features": arm, "steps": len(times), "step_s": statistics.median(times),
                   "wait_fraction": sum(waits) / sum(times), "sequences_per_step": config.sequences_per_step}
            rows.append(row)
            print(f"training on {arm} features: {row['step_s']:.2f} s per step, waiting "
                  f"{100 * row['wait_fraction']:.1f}% of it", flush=True)
    return rows


def link_calculation(tokens_per_sample: int) -> dict:
    """What a 400 Gb/s link carries of a Kimi-K3-sized target's features: a stated calculation, not a measurement.

    Five taps and the final hidden state in bf16 per token; the hidden size of 7,168 is Kimi K2's (the K3 reports
    we hold do not state one)."""
    hidden, taps, link_bytes_per_s = 7168, 5, 400e9 / 8
    per_token = (taps + 1) * hidden * 2
    return {"hidden_size": hidden, "taps": taps, "bytes_per_token": per_token, "link_gbit_per_s": 400,
            "tokens_per_s_per_link": link_bytes_per_s / per_token,
            "samples_per_s_per_link": link_bytes_per_s / (per_token * tokens_per_sample),
            "tokens_per_sample": tokens_per_sample}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warm-up", type=int, default=2)
    parser.add_argument("--transports", nargs="+", default=["gloo", "mooncake"], choices=["gloo", "mooncake"])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.steps <= args.warm_up:
        parser.error("--steps must exceed --warm-up")
    transport = [transport_row(name, args.samples, args.tokens) for name in args.transports]
    training = training_rows(["offline", *[name for name in args.transports if name != "gloo"]], args.samples,
                             args.tokens, args.steps, args.warm_up)
    path = write_result("streaming_cpu", {"tokens_per_sample": args.tokens, "hidden_size": HIDDEN, "taps": TAPS,
                                          "bytes_per_sample": sample_bytes(args.tokens), "transport": transport,
                                          "training": training, "warm_up_steps": args.warm_up,
                                          "not_trained_on": {"gloo": GLOO_TRAINING},
                                          "kimi_k3_link": link_calculation(32768)}, args.out)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
