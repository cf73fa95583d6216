"""Cross-process handoff: SlotRing vs multiprocessing.Queue vs torch.multiprocessing.Queue.

Two measurements, each with a fresh producer process (spawn) per transport:

* latency: the producer sends a 64-byte batch every ``interval_s`` to a
  consumer that is already blocked waiting for it; the batch carries
  ``time.monotonic_ns()`` taken just before the handoff (CLOCK_MONOTONIC is
  shared by every process), the consumer subtracts it from its own clock once
  it has read the batch's header and handed the batch back (ring slot
  released, shared tensor returned to the pool).  The CPU time of the
  consumer process over the wall time of the run is reported too: a waiter
  that spins trades CPU for latency.
* throughput: the producer writes 4 MiB batches as fast as the transport takes
  them; the consumer checks each batch's sequence number and hands it back.

Every transport moves the bytes from a producer buffer to memory the consumer
can read: the ring copies them into a shared slot, ``multiprocessing.Queue``
pickles them through a pipe, the torch queue copies them into one of a pool of
shared tensors whose index comes back on a second queue.
"""

from __future__ import annotations

import multiprocessing
import threading
import time
from typing import Any, Callable, NamedTuple, Optional

import numpy as np

TRANSPORTS = ("slot_ring", "slot_ring_nospin", "slot_ring_spin", "mp_queue", "torch_queue")
LABELS = {
    "slot_ring": "SlotRing (default wait)",
    "slot_ring_nospin": "SlotRing (spin off)",
    "slot_ring_spin": "SlotRing (spin 1 ms)",
    "mp_queue": "multiprocessing.Queue",
    "torch_queue": "torch.multiprocessing.Queue",
}
_TIMEOUT_S = 10.0
# Shared tensors in flight on the torch queue: throughput needs a few; the latency
# run uses one so a slow handoff cannot queue batches behind each other.
_TORCH_POOL_THROUGHPUT = 4
_TORCH_POOL_LATENCY = 1


def _sleep_until(deadline_ns: int) -> None:
    remaining = deadline_ns - time.monotonic_ns()
    if remaining > 0:
        time.sleep(remaining / 1e9)


# The spin budget of each ring variant: the default (None) is the standard policy
# (spin 2 ms, pausing then yielding, while producer and consumer fit the CPUs; yield
# 20 us, then sleep otherwise), 0 sleeps at once, 1000 us outlasts the 0.5 ms publish interval.
_RING_SPIN_US = {"slot_ring": None, "slot_ring_nospin": 0.0, "slot_ring_spin": 1000.0}


def _ring_spin_kwargs(transport: str) -> dict[str, Any]:
    spin = _RING_SPIN_US[transport]
    return {} if spin is None else {"spin_us": spin}


# ---- producers (run in the child process; importable for spawn) -------------------

def _produce(transport: str, channel: Any, ready: Any, go: Any, done: Any, count: int,
             payload_nbytes: int, interval_s: float) -> None:
    """Sends ``count`` batches of ``payload_nbytes`` (every ``interval_s``, 0 = back to back).

    Stays alive until the consumer sets ``done``: torch hands shared tensors over
    by passing file descriptors that this process must still be able to serve.
    """
    source = np.full(payload_nbytes, 7, dtype=np.uint8)
    send = _make_sender(transport, channel, source)
    ready.set()
    if not go.wait(_TIMEOUT_S):
        return
    next_ns = time.monotonic_ns()
    for sequence in range(count):
        if interval_s > 0:
            next_ns += int(interval_s * 1e9)
            _sleep_until(next_ns)
        send(sequence)
    done.wait(_TIMEOUT_S)


def _make_sender(transport: str, channel: Any, source: np.ndarray) -> Callable[[int], None]:
    if transport.startswith("slot_ring"):
        from tensorxfer.ipc import SlotRing

        from tensorxfer.runtime import CopyEngine

        ring = SlotRing.attach(channel, **_ring_spin_kwargs(transport))
        # The ring's producer fills slots with the library's copy engine, as a
        # tensorxfer user would (torch's copy_ below is multi-threaded too).
        engine = CopyEngine()

        def send_through_ring(sequence: int) -> None:
            slot = ring.acquire_free(timeout=_TIMEOUT_S)
            view = ring.slot_array(slot)
            engine.copy(view[: source.nbytes], source)
            header = view[:16].view(np.int64)
            header[1] = sequence
            header[0] = time.monotonic_ns()
            ring.publish(slot, tick_id=sequence)

        return send_through_ring
    if transport == "mp_queue":
        def send_through_queue(sequence: int) -> None:
            channel.put((time.monotonic_ns(), sequence, source))

        return send_through_queue
    import torch

    queue, free_queue, pool = channel
    source_tensor = torch.from_numpy(source)

    def send(sequence: int) -> None:
        index = free_queue.get(timeout=_TIMEOUT_S)
        pool[index].copy_(source_tensor)
        queue.put((time.monotonic_ns(), sequence, index, pool[index]))

    return send


# ---- consumer side (the benchmark process) ---------------------------------------

def _thread_schedstat_ns() -> Optional[tuple[int, int]]:
    """(ns on a CPU, ns runnable but waiting for one) of the calling thread; None if unknown.

    From /proc/<pid>/task/<tid>/schedstat (Linux, CONFIG_SCHED_INFO).
    """
    try:
        with open(f"/proc/self/task/{threading.get_native_id()}/schedstat") as stats:
            on_cpu, waiting = stats.read().split()[:2]
        return int(on_cpu), int(waiting)
    except (OSError, ValueError):
        return None


class _LoopClock:
    """Wall time, the process's CPU time and the calling thread's scheduler times from one point on."""

    def __init__(self) -> None:
        self.wall, self.cpu, self.sched = time.monotonic(), time.process_time(), _thread_schedstat_ns()

    def shares(self) -> tuple[float, Optional[float], float]:
        """(process CPU share, thread demand share or None, process CPU seconds) since construction."""
        wall = max(time.monotonic() - self.wall, 1e-9)
        cpu = time.process_time() - self.cpu
        sched = _thread_schedstat_ns()
        demand = None
        if self.sched is not None and sched is not None:
            demand = ((sched[0] - self.sched[0]) + (sched[1] - self.sched[1])) / 1e9 / wall
        return cpu / wall, demand, cpu

class _Consumer:
    """Owns one transport's consumer end and its producer process."""

    def __init__(self, transport: str, payload_nbytes: int, torch_pool: int = _TORCH_POOL_THROUGHPUT) -> None:
        self.transport = transport
        self.payload_nbytes = payload_nbytes
        self.cpu_share = 0.0
        self.cpu_demand_share: Optional[float] = None
        self.cpu_us_per_batch = 0.0
        self.ring = None
        if transport.startswith("slot_ring"):
            from tensorxfer.ipc import SlotRing

            self.ring = SlotRing.create(depth=4, slot_nbytes=max(64, payload_nbytes),
                                        **_ring_spin_kwargs(transport))
            self.context = multiprocessing.get_context("spawn")
            self.channel: Any = self.ring.handle
            self.slots = [self.ring.slot_array(i) for i in range(self.ring.depth)]
            # Views made once, as a user reading each slot's header would.
            self.headers = [slot[:16].view(np.int64) for slot in self.slots]
        elif transport == "mp_queue":
            self.context = multiprocessing.get_context("spawn")
            self.channel = self.context.Queue()
        else:
            import torch
            import torch.multiprocessing as torch_mp

            self.context = torch_mp.get_context("spawn")
            pool = [torch.zeros(payload_nbytes, dtype=torch.uint8).share_memory_()
                    for _ in range(torch_pool)]
            queue, free_queue = self.context.Queue(), self.context.Queue()
            for index in range(torch_pool):
                free_queue.put(index)
            self.free_queue = free_queue
            self.channel = (queue, free_queue, pool)

    def receive(self) -> tuple[int, int]:
        """Waits for the next batch; returns (send timestamp ns, sequence); frees it at once."""
        if self.ring is not None:
            slot, tick = self.ring.acquire_ready(timeout=_TIMEOUT_S)
            sent_ns, sequence = self.headers[slot].tolist()
            self.ring.release(slot)
            return sent_ns, sequence
        if self.transport == "mp_queue":
            sent_ns, sequence, payload = self.channel.get(timeout=_TIMEOUT_S)
            if payload.nbytes != self.payload_nbytes:
                raise RuntimeError(f"mp_queue delivered {payload.nbytes} bytes, expected {self.payload_nbytes}")
            return sent_ns, sequence
        sent_ns, sequence, index, tensor = self.channel[0].get(timeout=_TIMEOUT_S)
        if tensor.numel() != self.payload_nbytes:
            raise RuntimeError(f"torch_queue delivered {tensor.numel()} bytes, expected {self.payload_nbytes}")
        del tensor
        self.free_queue.put(index)
        return sent_ns, sequence

    def run(self, count: int, interval_s: float, warmup: int = 0) -> list[tuple[int, int]]:
        """Starts the producer, receives ``count`` batches; returns (sent ns, received ns) pairs.

        Also sets, over the batches after the first ``warmup`` (the producer's
        start-up is not the wait's cost): ``cpu_share``, this (the consumer)
        process's CPU time over the loop's wall time (1.0 = one core busy all
        the time; helper threads such as a queue's feeder count);
        ``cpu_demand_share``, the time the receiving thread was running or
        runnable (waiting for a CPU: a spinning waiter that yields to other
        work stays runnable) over the wall time, or None where the kernel does
        not say; and ``cpu_us_per_batch``, the process's CPU time per batch.
        """
        ready, go, done = self.context.Event(), self.context.Event(), self.context.Event()
        producer = self.context.Process(
            target=_produce, args=(self.transport, self.channel, ready, go, done, count,
                                   self.payload_nbytes, interval_s), daemon=True)
        producer.start()
        try:
            if not ready.wait(60.0):
                raise TimeoutError(f"{self.transport} producer did not start within 60 s")
            go.set()
            stamps = []
            clock = _LoopClock()
            for expected in range(count):
                if expected == warmup:
                    clock = _LoopClock()
                sent_ns, sequence = self.receive()
                stamps.append((sent_ns, time.monotonic_ns()))
                if sequence != expected:
                    raise RuntimeError(f"{self.transport}: got batch {sequence}, expected {expected}")
            self.cpu_share, self.cpu_demand_share, cpu_s = clock.shares()
            self.cpu_us_per_batch = 1e6 * cpu_s / max(count - min(warmup, count), 1)
            done.set()
            producer.join(_TIMEOUT_S)
            return stamps
        finally:
            if producer.is_alive():
                producer.kill()
                producer.join()

    def close(self) -> None:
        """Releases the transport (the ring's segment is unlinked)."""
        if self.ring is not None:
            self.slots, self.headers = [], []
            self.ring.close()
        elif self.transport == "mp_queue":
            self.channel.close()
            self.channel.join_thread()


def measure_latency(transport: str, count: int, interval_s: float, warmup: int) -> list[float]:
    """Handoff latencies in microseconds of ``count`` 64-byte batches (first ``warmup`` dropped)."""
    return measure_consumer_cost(transport, count, interval_s, warmup).latencies_us


class ConsumerCost(NamedTuple):
    """What receiving cost the consumer (batches after the warm-up only)."""

    latencies_us: list[float]
    cpu_percent: float  # the process's CPU time over wall time, % of one core
    demand_percent: Optional[float]  # receiving thread running or waiting for a CPU, % of wall (None: unknown)
    cpu_us_per_batch: float  # the process's CPU time per batch


def measure_consumer_cost(transport: str, count: int, interval_s: float, warmup: int) -> ConsumerCost:
    """Latencies and CPU cost of ``count`` 64-byte batches sent every ``interval_s``.

    ``cpu_percent`` is what the consumer got; ``demand_percent`` what its waits
    asked for: on a busy machine a spinning wait that yields to other work gets
    little CPU yet stays runnable, so only the demand tells the policies apart
    whatever the load.
    """
    consumer = _Consumer(transport, payload_nbytes=64, torch_pool=_TORCH_POOL_LATENCY)
    try:
        stamps = consumer.run(count + warmup, interval_s, warmup)
    finally:
        consumer.close()
    demand = None if consumer.cpu_demand_share is None else 100.0 * consumer.cpu_demand_share
    return ConsumerCost([(received - sent) / 1e3 for sent, received in stamps[warmup:]],
                        100.0 * consumer.cpu_share, demand, consumer.cpu_us_per_batch)


def measure_throughput(transport: str, count: int, payload_nbytes: int) -> float:
    """Batches per second of ``count`` back-to-back batches of ``payload_nbytes``."""
    consumer = _Consumer(transport, payload_nbytes=payload_nbytes)
    try:
        stamps = consumer.run(count, interval_s=0.0)
    finally:
        consumer.close()
    # From the first batch's arrival to the last's: process start-up is not counted.
    elapsed_ns = stamps[-1][1] - stamps[0][1]
    return (len(stamps) - 1) / (elapsed_ns / 1e9)


def available_transports() -> list[str]:
    """The transports this machine can run (the torch queue needs torch)."""
    try:
        import torch  # noqa: F401
    except ImportError:
        return [t for t in TRANSPORTS if t != "torch_queue"]
    return list(TRANSPORTS)
