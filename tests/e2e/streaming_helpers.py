"""Processes for the streaming tests: producers that run a tiny target, and a consumer that kills one."""

import json
import os
import signal

import torch

from dspark.train.features import target_features
from tests.e2e.conftest import tiny_target

NUM_SAMPLES = 12
SLOT_BYTES = 1 << 20


def tiny_sequences(count=NUM_SAMPLES, seed=0):
    """Token sequences of uneven lengths; their features are all a producer is asked for."""
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 48, (int(torch.randint(5, 30, (1,), generator=gen)),), generator=gen)
            for _ in range(count)]


def features_of(target, sequences, index):
    return target_features(target, sequences[index])


def producer_main(backend, rank, world, port):
    torch.set_num_threads(1)
    from dspark.train.streaming import DistributedProducer, MooncakeProducer, serve

    target, sequences = tiny_target(vocab=48), tiny_sequences()
    if backend == "gloo":
        torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                             world_size=world)
        transport = DistributedProducer(0)
    else:
        store = torch.distributed.TCPStore("127.0.0.1", port, is_master=False)
        transport = MooncakeProducer(store, rank, SLOT_BYTES)
    serve(transport, lambda i: features_of(target, sequences, i))
    os._exit(0)  # skip gloo's teardown: a peer of this group was killed on purpose


def consumer_main(backend, world, port, pids, victim, out_dir):
    """Stream every sample; once the victim producer has delivered two, kill it with SIGKILL."""
    import safetensors.torch

    from dspark.train.streaming import DistributedConsumer, FeatureStream, MooncakeConsumer

    torch.set_num_threads(1)
    producers = list(range(1, world))
    if backend == "gloo":
        torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0,
                                             world_size=world)
        transport = DistributedConsumer(producers)
    else:
        store = torch.distributed.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)
        transport = MooncakeConsumer(store, producers, SLOT_BYTES, credit=2, dead_after=2.0)
    stream = FeatureStream(transport, list(range(NUM_SAMPLES)), credit=2, timeout=120)
    tensors, killed = {}, False
    for index, taps, hidden in stream:
        tensors[f"{index}.taps"], tensors[f"{index}.hidden"] = taps, hidden
        if not killed and sum(p == victim for _, p in stream.log) >= 2:
            os.kill(pids[victim], signal.SIGKILL)
            killed = True
    safetensors.torch.save_file(tensors, os.path.join(out_dir, "features.safetensors"))
    with open(os.path.join(out_dir, "log.json"), "w", encoding="utf-8") as f:
        json.dump({"log": stream.log, "duplicates": stream.duplicates, "dead": sorted(stream.dead),
                   "killed": killed}, f)
    os._exit(0)
