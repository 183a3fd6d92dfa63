"""Streamed features: every sample exactly once, equal to the in-process target's, a producer killed or not."""

import importlib.util
import json
import queue
import socket
import threading

import pytest
import torch

from dspark.testing import assert_close
from dspark.train.config import TrainConfig
from dspark.train.features import OnlineFeatures
from dspark.train.streaming import ConsumerTransport, Event, FeatureStream, StreamedFeatures
from dspark.train.trainer import Trainer
from tests.e2e.conftest import tiny_target
from tests.e2e.streaming_helpers import NUM_SAMPLES, consumer_main, features_of, producer_main, tiny_sequences
from tests.e2e.training_helpers import tiny_samples, tiny_trainer


class ThreadTransport(ConsumerTransport):
    """In-process producers (threads) with scripted faults: ``die_after[p]`` results, then silence and a
    death report; ``echo`` sends one result twice (a duplicate the stream must drop)."""

    def __init__(self, compute, producers=(1, 2), die_after=None, echo=None):
        self.producers, self.events = list(producers), queue.Queue()
        self.compute, self.die_after, self.echo = compute, dict(die_after or {}), echo
        self.served = dict.fromkeys(self.producers, 0)
        self.assigned: list[tuple[int, int]] = []
        self.lock = threading.Lock()  # a TargetModel's hooks are not thread-safe: one forward at a time

    def assign(self, producer, index):
        self.assigned.append((producer, index))
        threading.Thread(target=self._work, args=(producer, index)).start()

    def _work(self, producer, index):
        if self.served[producer] >= self.die_after.get(producer, 1 << 30):
            self.events.put(Event(producer))
            return
        self.served[producer] += 1
        with self.lock:
            taps, hidden = self.compute(index)
        self.events.put(Event(producer, index, taps, hidden))
        if index == self.echo:
            self.events.put(Event(producer, index, taps, hidden))

    def close(self, live):
        pass


def _fake(index):
    return torch.full((3, 2), float(index)), torch.full((3, 1), -float(index))


@pytest.mark.parametrize("die_after", [None, {1: 0}, {1: 2}, {2: 1}])
def test_stream_delivers_each_index_once_when_producers_die_or_repeat(die_after):
    # Index 0 is assigned first, so its echo is queued while most samples are still to come.
    transport = ThreadTransport(_fake, die_after=die_after, echo=0)
    stream = FeatureStream(transport, list(range(10)), credit=2, timeout=10)
    got = [(index, float(taps[0, 0])) for index, taps, _ in stream]
    assert sorted(i for i, _ in got) == list(range(10)), "lost or repeated a sample"
    assert all(i == v for i, v in got), "a sample came back with another sample's features"
    assert stream.duplicates == 1
    assert stream.dead == set(die_after or {})


def test_stream_fails_loudly_when_every_producer_dies():
    stream = FeatureStream(ThreadTransport(_fake, die_after={1: 1, 2: 1}), list(range(6)), timeout=10)
    with pytest.raises(RuntimeError, match="every producer died"):
        list(stream)
    with pytest.raises(ValueError, match="distinct"):
        FeatureStream(ThreadTransport(_fake), [1, 1])


def test_trainer_on_streamed_features_equals_online():
    """Same steps, same anchors: streamed features must train the same drafter as the in-process target."""
    online, target = tiny_trainer(steps=3)
    online.fit(progress=False)
    samples = tiny_samples(target)[:6]
    order = [(step * 2 + i) % len(samples) for step in range(3) for i in range(2)]
    order = list(dict.fromkeys(order))
    source = StreamedFeatures(FeatureStream(ThreadTransport(lambda i: OnlineFeatures(target).features(i, samples[i])),
                                            order, timeout=30))
    streamed, _ = tiny_trainer(steps=3)
    streamed = Trainer(streamed.drafter, target.lm_head_weight(), source, samples, TrainConfig(
        steps=3, sequences_per_step=2, num_anchors=8, eval_every=0, lr=3e-3, loss_backend="torch"))
    streamed.fit(progress=False)
    for (name, a), b in zip(online.drafter.state_dict().items(), streamed.drafter.state_dict().values()):
        assert torch.equal(a, b), f"{name} differs"


def test_a_restarted_consumer_asks_for_what_the_remaining_steps_read_and_ends_as_one_never_stopped(tmp_path):
    """The training process (the consumer) stops after its step-2 checkpoint, mid-stream, and a new one resumes:
    its stream asks for :meth:`Trainer.feature_order`, which is exactly what steps 3 and 4 read, once each, and
    it ends with the weights of a consumer never stopped."""
    target = tiny_target(vocab=48)
    samples = tiny_samples(target)[:6]
    online = OnlineFeatures(target)

    def streamed_trainer(steps=4):
        trainer, _ = tiny_trainer(steps=steps, sequences_per_step=2)
        transport = ThreadTransport(lambda i: online.features(i, samples[i]))
        stream = FeatureStream(transport, trainer.feature_order(), timeout=30)
        trainer.source = StreamedFeatures(stream)
        return trainer, stream

    never_stopped, _ = streamed_trainer()
    never_stopped.fit(progress=False)

    first, first_stream = streamed_trainer()
    for _ in range(2):
        first.train_step()
    first.save(tmp_path / "run")  # then the process dies: the rest of its stream is never read
    assert first.feature_order() == [4, 5, 0, 1]  # steps 3 and 4 read sequences 4, 5, then 0, 1 again

    second, _ = tiny_trainer(steps=4, sequences_per_step=2)
    second.resume(tmp_path / "run", target)
    assert second.step == 2 and second.feature_order() == [4, 5, 0, 1]
    stream = FeatureStream(ThreadTransport(lambda i: online.features(i, samples[i])), second.feature_order(),
                           timeout=30)
    second.source = StreamedFeatures(stream)
    second.fit(progress=False)
    assert sorted(index for index, _ in stream.log) == [0, 1, 4, 5] and stream.duplicates == 0
    for (name, a), b in zip(never_stopped.drafter.state_dict().items(), second.drafter.state_dict().values()):
        assert torch.equal(a, b), f"{name} differs"


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("backend", ["gloo", "mooncake"])
def test_killing_a_producer_mid_stream_loses_and_repeats_nothing(backend, tmp_path):
    if backend == "mooncake" and importlib.util.find_spec("mooncake") is None:
        pytest.skip("pip install mooncake-transfer-engine-non-cuda (and apt install libibverbs1)")
    import safetensors.torch

    ctx = torch.multiprocessing.get_context("spawn")
    world, port, victim = 3, _free_port(), 1
    producers = {rank: ctx.Process(target=producer_main, args=(backend, rank, world, port)) for rank in (1, 2)}
    for p in producers.values():
        p.start()
    consumer = ctx.Process(target=consumer_main,
                           args=(backend, world, port, {r: p.pid for r, p in producers.items()}, victim, str(tmp_path)))
    consumer.start()
    consumer.join(240)
    for p in producers.values():
        p.join(30)
    assert consumer.exitcode == 0, f"consumer exit code {consumer.exitcode}"
    record = json.loads((tmp_path / "log.json").read_text(encoding="utf-8"))
    assert record["killed"] and producers[victim].exitcode == -9 and producers[2].exitcode == 0
    assert record["dead"] == [victim]
    indices = [index for index, _ in record["log"]]
    assert sorted(indices) == list(range(NUM_SAMPLES)), f"lost or repeated samples: {indices}"
    assert sum(p == 2 for _, p in record["log"]) > NUM_SAMPLES // 2, "the survivor should finish the victim's share"
    received = safetensors.torch.load_file(tmp_path / "features.safetensors")
    target, sequences = tiny_target(vocab=48), tiny_sequences()
    for index in range(NUM_SAMPLES):
        taps, hidden = features_of(target, sequences, index)
        # Same fp32 forward in another process (one thread there): rounding-level differences at most.
        assert_close(received[f"{index}.taps"], taps, rtol=1e-5, atol=1e-5, name=f"taps {index}")
        assert_close(received[f"{index}.hidden"], hidden, rtol=1e-5, atol=1e-5, name=f"hidden {index}")
