"""Streamed hidden states: target processes produce features, the training process consumes them.

The third :class:`dspark.train.features.FeatureSource` (after offline files and the in-process target). One
consumer owns the list of sample indices and hands them out, ``credit`` at a time, to producers; a
producer runs the target on each sample it is given and sends back ``(index, taps [S, F], final hidden
[S, H])``. The consumer keeps the first copy of every index and drops any later one, and when a producer
dies the indices it still held go back to the front of the queue: every sample arrives exactly once,
whichever producers survive.

Two transports implement the same small interface (:class:`ConsumerTransport`, :class:`ProducerTransport`):

* :class:`DistributedConsumer` / :class:`DistributedProducer`: ``torch.distributed`` point-to-point
  messages (gloo on CPU, NCCL on GPU), one listener thread per producer. A dead producer shows up as
  gloo's "connection closed" error in its listener.
* :class:`MooncakeConsumer` / :class:`MooncakeProducer`: the Mooncake transfer engine
  (``pip install mooncake-transfer-engine-non-cuda``; it needs the ``libibverbs1`` system library even
  for TCP). Producers write results straight into the consumer's registered memory, one slot each, and
  the consumer writes assignments into each producer's mailbox; peers find each other through a
  ``torch.distributed.TCPStore`` and Mooncake's ``P2PHANDSHAKE`` mode. A dead producer shows up as a
  heartbeat (a store counter) that stops moving.
"""

from __future__ import annotations

import json
import queue
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

STOP = -1


@dataclass
class Event:
    """What a consumer transport reports: a result, or that a producer died."""

    producer: int
    index: int | None = None
    taps: torch.Tensor | None = None
    hidden: torch.Tensor | None = None

    @property
    def dead(self) -> bool:
        return self.index is None


class ConsumerTransport:
    """The consumer's side: ``producers``, ``assign(p, index)`` (raises if p is gone), ``events`` (a queue
    of :class:`Event`), ``close()`` (tell live producers to stop)."""

    producers: list[int]
    events: queue.Queue

    def assign(self, producer: int, index: int) -> None:
        raise NotImplementedError

    def close(self, live: set[int]) -> None:
        raise NotImplementedError


class ProducerTransport:
    """The producer's side: ``next_assignment()`` (an index, or ``None`` to stop) and ``send(...)``."""

    def next_assignment(self) -> int | None:
        raise NotImplementedError

    def send(self, index: int, taps: torch.Tensor, hidden: torch.Tensor) -> None:
        raise NotImplementedError


@dataclass
class FeatureStream:
    """Hands ``indices`` out to the transport's producers and yields each ``(index, taps, hidden)`` once.

    Args:
        transport: the consumer side of a transport.
        indices: sample indices in the order they should arrive (the training order).
        credit: indices outstanding per producer (2 keeps a producer busy while its last result travels).
        timeout: seconds without any event before giving up.
    """

    transport: ConsumerTransport
    indices: list[int]
    credit: int = 2
    timeout: float = 300.0
    duplicates: int = 0
    dead: set[int] = field(default_factory=set)
    log: list[tuple[int, int]] = field(default_factory=list)  # (index, producer) of every kept result

    def __post_init__(self) -> None:
        if len(set(self.indices)) != len(self.indices):
            raise ValueError("indices must be distinct")
        if self.credit < 1:
            raise ValueError(f"credit must be >= 1, got {self.credit}")

    def __iter__(self) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
        pending = deque(self.indices)
        held = {p: deque() for p in self.transport.producers}
        received: set[int] = set()

        def top_up() -> None:
            for p, mine in held.items():
                while p not in self.dead and pending and len(mine) < self.credit:
                    index = pending.popleft()
                    try:
                        self.transport.assign(p, index)
                    except RuntimeError:
                        pending.appendleft(index)
                        self._lose(p, held, pending)
                        break
                    mine.append(index)

        top_up()
        try:
            while len(received) < len(self.indices):
                if len(self.dead) == len(held):
                    raise RuntimeError(f"every producer died with {len(self.indices) - len(received)} samples left")
                try:
                    event = self.transport.events.get(timeout=self.timeout)
                except queue.Empty:
                    raise TimeoutError(f"no producer answered for {self.timeout} s") from None
                if event.dead:
                    self._lose(event.producer, held, pending)
                elif event.producer not in self.dead:
                    if event.index in held[event.producer]:
                        held[event.producer].remove(event.index)
                    if event.index in received:
                        self.duplicates += 1
                    else:
                        received.add(event.index)
                        self.log.append((event.index, event.producer))
                        yield event.index, event.taps, event.hidden
                top_up()
        finally:
            self.transport.close(set(held) - self.dead)

    def _lose(self, producer: int, held: dict, pending: deque) -> None:
        """A producer died: what it held goes back to the front of the queue, in order."""
        if producer in self.dead:
            return
        self.dead.add(producer)
        pending.extendleft(reversed(held[producer]))
        held[producer].clear()


def serve(transport: ProducerTransport, compute: Callable[[int], tuple[torch.Tensor, torch.Tensor]]) -> int:
    """The producer loop: compute each assigned index and send it back, until told to stop. Returns the count."""
    served = 0
    while (index := transport.next_assignment()) is not None:
        taps, hidden = compute(index)
        transport.send(index, taps, hidden)
        served += 1
    return served


class StreamedFeatures:
    """A :class:`dspark.train.features.FeatureSource` fed by a :class:`FeatureStream` in a background thread.

    ``features(index, sample)`` waits until that index has arrived (stream in the order the trainer reads).
    """

    def __init__(self, stream: FeatureStream):
        self._rows: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._ready = threading.Condition()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._drain, args=(stream,), daemon=True)
        self._thread.start()

    def _drain(self, stream: FeatureStream) -> None:
        try:
            for index, taps, hidden in stream:
                with self._ready:
                    self._rows[index] = (taps, hidden)
                    self._ready.notify_all()
        except BaseException as error:  # handed to the trainer's thread on its next read
            with self._ready:
                self._error = error
                self._ready.notify_all()

    def features(self, index, sample):
        with self._ready:
            self._ready.wait_for(lambda: index in self._rows or self._error is not None)
            if index not in self._rows:
                raise RuntimeError(f"the feature stream failed before sample {index} arrived") from self._error
            return self._rows[index]


# ---------------------------------------------------------------------------------------------------------
# torch.distributed transport


class DistributedConsumer(ConsumerTransport):
    """Consumer over an initialised process group: this rank receives from ``producers`` (their ranks).

    Tensors travel on ``device`` (``cuda`` under NCCL, ``cpu`` under gloo) and arrive on the CPU.
    """

    def __init__(self, producers: list[int], device: str | torch.device = "cpu"):
        self.producers = list(producers)
        self.device = torch.device(device)
        self.events = queue.Queue()
        self._sends: list = []
        self._listeners = [threading.Thread(target=self._listen, args=(p,), daemon=True) for p in self.producers]
        for listener in self._listeners:
            listener.start()

    def _listen(self, producer: int) -> None:
        dist = torch.distributed
        try:
            while True:
                header = torch.zeros(4, dtype=torch.long, device=self.device)
                dist.recv(header, src=producer)
                index, seq, taps_width, hidden_width = header.tolist()
                if index == STOP:
                    return
                taps = torch.empty(seq, taps_width, device=self.device)
                hidden = torch.empty(seq, hidden_width, device=self.device)
                dist.recv(taps, src=producer)
                dist.recv(hidden, src=producer)
                self.events.put(Event(producer, index, taps.cpu(), hidden.cpu()))
        except RuntimeError:  # gloo: "connection closed by peer"; the stream decides what it means
            self.events.put(Event(producer))

    def assign(self, producer: int, index: int) -> None:
        message = torch.tensor([index], dtype=torch.long, device=self.device)
        # Asynchronous: a producer posts its receive only when it is ready for more work.
        self._sends.append((message, torch.distributed.isend(message, dst=producer)))

    def close(self, live: set[int]) -> None:
        for producer in live:
            self.assign(producer, STOP)
        for listener, producer in zip(self._listeners, self.producers):
            if producer in live:
                listener.join()


class DistributedProducer(ProducerTransport):
    def __init__(self, consumer: int = 0, device: str | torch.device = "cpu"):
        self.consumer = consumer
        self.device = torch.device(device)

    def next_assignment(self) -> int | None:
        message = torch.zeros(1, dtype=torch.long, device=self.device)
        torch.distributed.recv(message, src=self.consumer)
        index = int(message)
        if index == STOP:
            torch.distributed.send(torch.tensor([STOP, 0, 0, 0], device=self.device), dst=self.consumer)
            return None
        return index

    def send(self, index: int, taps: torch.Tensor, hidden: torch.Tensor) -> None:
        taps = taps.to(self.device, torch.float32).contiguous()
        hidden = hidden.to(self.device, torch.float32).contiguous()
        header = torch.tensor([index, taps.shape[0], taps.shape[1], hidden.shape[1]], device=self.device)
        for tensor in (header, taps, hidden):
            torch.distributed.send(tensor, dst=self.consumer)


# ---------------------------------------------------------------------------------------------------------
# Mooncake transport

HEADER = struct.Struct("<6q")  # seq, index, rows, taps width, hidden width, seq again (torn-write check)
MAILBOX = struct.Struct("<3q")  # seq, index, seq again
HEARTBEAT_S = 0.2


def _mooncake_engine():
    try:
        from mooncake.engine import TransferEngine
    except ImportError as error:
        raise ImportError("the Mooncake transport needs `pip install mooncake-transfer-engine-non-cuda` and the "
                          "libibverbs1 system package") from error
    engine = TransferEngine()
    if engine.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") != 0:
        raise RuntimeError("the Mooncake transfer engine did not start (TCP, P2PHANDSHAKE, 127.0.0.1)")
    return engine


def _registered(engine, size: int) -> torch.Tensor:
    buffer = torch.zeros(size, dtype=torch.uint8)
    if engine.register_memory(buffer.data_ptr(), size) != 0:
        raise RuntimeError(f"Mooncake could not register {size} bytes")
    return buffer


class MooncakeConsumer(ConsumerTransport):
    """Consumer over the Mooncake transfer engine; peers meet in ``store`` (a ``TCPStore`` this side hosts
    or joins). ``slot_bytes`` bounds one result: header plus ``rows · (taps + hidden width) · 4`` bytes.
    Each producer gets ``credit`` result slots here and ``credit`` mailbox entries on its side, used in turn
    (the stream's credit must not exceed it): at most ``credit`` assignments are unanswered at any time,
    so neither side overwrites a message the other has not read. A producer whose heartbeat stands still
    for ``dead_after`` seconds is reported dead."""

    def __init__(self, store, producers: list[int], slot_bytes: int = 8 << 20, credit: int = 2,
                 dead_after: float = 3.0):
        self.producers = list(producers)
        self.events = queue.Queue()
        self.store, self.slot_bytes, self.credit, self.dead_after = store, slot_bytes, credit, dead_after
        self.engine = _mooncake_engine()
        self.slots = _registered(self.engine, slot_bytes * credit * len(self.producers))
        self.staging = _registered(self.engine, MAILBOX.size * credit * len(self.producers))
        self.host = f"127.0.0.1:{self.engine.get_rpc_port()}"
        store.set("mooncake/consumer", json.dumps({"host": self.host, "slots": self.slots.data_ptr(),
                                                    "slot_bytes": slot_bytes, "credit": credit,
                                                    "order": self.producers}))
        self.peers = {p: json.loads(store.get(f"mooncake/producer/{p}")) for p in self.producers}
        self._sent = dict.fromkeys(self.producers, 0)
        self._stop = threading.Event()
        self._poller = threading.Thread(target=self._poll, daemon=True)
        self._poller.start()

    def _slot(self, producer: int, number: int) -> torch.Tensor:
        """The slot result ``number`` (1-based) of ``producer`` lands in."""
        i = self.producers.index(producer) * self.credit + (number - 1) % self.credit
        return self.slots[i * self.slot_bytes: (i + 1) * self.slot_bytes]

    def _poll(self) -> None:
        seen = dict.fromkeys(self.producers, 0)
        beats = {p: (-1, time.monotonic()) for p in self.producers}
        reported: set[int] = set()
        checked = 0.0
        while not self._stop.is_set():
            for p in self.producers:
                if p not in reported:
                    self._read_slot(p, seen)
            now = time.monotonic()
            if now - checked > HEARTBEAT_S:
                checked = now
                for p in set(self.producers) - reported:
                    count = int(self.store.add(f"mooncake/beat/{p}", 0))
                    if count != beats[p][0]:
                        beats[p] = (count, now)
                    elif now - beats[p][1] > self.dead_after:
                        reported.add(p)
                        self.events.put(Event(p))
            time.sleep(0.001)

    def _read_slot(self, producer: int, seen: dict[int, int]) -> None:
        slot = self._slot(producer, seen[producer] + 1)
        seq, index, rows, taps_width, hidden_width, check = HEADER.unpack(slot[: HEADER.size].numpy().tobytes())
        # The header is written after its payload, and its last field repeats the first: a header seen
        # with both equal and the next number is complete, and so is the payload it announces.
        if seq != seen[producer] + 1 or check != seq:
            return
        floats = slot[HEADER.size: HEADER.size + rows * (taps_width + hidden_width) * 4].clone().view(torch.float32)
        seen[producer] = seq
        self.events.put(Event(producer, index, floats[: rows * taps_width].view(rows, taps_width),
                              floats[rows * taps_width:].view(rows, hidden_width)))

    def assign(self, producer: int, index: int) -> None:
        self._sent[producer] += 1
        entry = (self._sent[producer] - 1) % self.credit
        i = self.producers.index(producer) * self.credit + entry
        staging = self.staging[i * MAILBOX.size: (i + 1) * MAILBOX.size]
        message = MAILBOX.pack(self._sent[producer], index, self._sent[producer])
        staging.copy_(torch.frombuffer(bytearray(message), dtype=torch.uint8))
        peer = self.peers[producer]
        rc = self.engine.transfer_sync_write(peer["host"], staging.data_ptr(), peer["mailbox"] + entry * MAILBOX.size,
                                             MAILBOX.size)
        if rc != 0:
            raise RuntimeError(f"producer {producer} unreachable (Mooncake write returned {rc})")

    def close(self, live: set[int]) -> None:
        for producer in live:
            try:
                self.assign(producer, STOP)
            except RuntimeError:
                pass  # it died after its last result: nothing left to stop
        self._stop.set()
        self._poller.join()


class MooncakeProducer(ProducerTransport):
    def __init__(self, store, producer: int, slot_bytes: int = 8 << 20):
        self.store, self.producer = store, producer
        self.engine = _mooncake_engine()
        self.outbox = _registered(self.engine, slot_bytes)
        consumer = json.loads(store.get("mooncake/consumer"))
        self.mailbox = _registered(self.engine, MAILBOX.size * consumer["credit"])
        store.set(f"mooncake/producer/{producer}", json.dumps({"host": f"127.0.0.1:{self.engine.get_rpc_port()}",
                                                                "mailbox": self.mailbox.data_ptr()}))
        if consumer["slot_bytes"] != slot_bytes:
            raise ValueError(f"slot size {slot_bytes} differs from the consumer's {consumer['slot_bytes']}")
        self.consumer_host, self.credit = consumer["host"], consumer["credit"]
        self.first_slot = consumer["slots"] + consumer["order"].index(producer) * self.credit * slot_bytes
        self.slot_bytes, self._seen, self._sent = slot_bytes, 0, 0
        self._beating = threading.Thread(target=self._beat, daemon=True)
        self._beating.start()

    def _beat(self) -> None:
        while True:
            self.store.add(f"mooncake/beat/{self.producer}", 1)
            time.sleep(HEARTBEAT_S)

    def next_assignment(self) -> int | None:
        entry = self._seen % self.credit
        while True:
            message = self.mailbox[entry * MAILBOX.size: (entry + 1) * MAILBOX.size].numpy().tobytes()
            seq, index, check = MAILBOX.unpack(message)
            if seq == self._seen + 1 and check == seq:
                self._seen = seq
                return None if index == STOP else index
            time.sleep(0.0005)

    def send(self, index: int, taps: torch.Tensor, hidden: torch.Tensor) -> None:
        taps, hidden = taps.float().contiguous().cpu(), hidden.float().contiguous().cpu()
        body = torch.cat([taps.flatten(), hidden.flatten()]).view(torch.uint8)
        if HEADER.size + body.numel() > self.slot_bytes:
            raise ValueError(f"a result of {body.numel()} bytes does not fit a {self.slot_bytes}-byte slot")
        self._sent += 1
        slot = self.first_slot + (self._sent - 1) % self.credit * self.slot_bytes
        self.outbox[HEADER.size: HEADER.size + body.numel()].copy_(body)
        self._write(slot, HEADER.size, body.numel())  # the payload first, then the header that announces it
        header = HEADER.pack(self._sent, index, taps.shape[0], taps.shape[1], hidden.shape[1], self._sent)
        self.outbox[: HEADER.size].copy_(torch.frombuffer(bytearray(header), dtype=torch.uint8))
        self._write(slot, 0, HEADER.size)

    def _write(self, slot: int, offset: int, length: int) -> None:
        rc = self.engine.transfer_sync_write(self.consumer_host, self.outbox.data_ptr() + offset, slot + offset,
                                             length)
        if rc != 0:
            raise RuntimeError(f"consumer unreachable (Mooncake write returned {rc})")
