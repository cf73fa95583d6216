"""SlotRing across real processes (spawn and fork): several producers, killed
producers and consumers, and /dev/shm left clean."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time

import numpy as np
import pytest

import tensorxfer
from tensorxfer.ipc import SlotRing

pytestmark = pytest.mark.multiprocess

START_METHODS = ["spawn", "fork"]
SLOT_NBYTES = 128


def shm_exists(name: str) -> bool:
    return os.path.exists("/dev/shm/" + name.lstrip("/"))


# ---- workers (module level so spawn can import them) ----------------------------


def publish_batches(ring, producer_id: int, count: int) -> None:
    """Publishes `count` slots filled with (producer_id, i), tick (producer_id << 32) | i."""
    for index in range(count):
        slot = ring.acquire_free(timeout=10.0)
        view = ring.slot_array(slot)
        view[:16].view(np.int64)[:] = (producer_id, index)
        view[16:] = index % 251
        ring.publish(slot, tick_id=(producer_id << 32) | index)


def produce(handle, producer_id: int, count: int) -> None:
    """Attaches and publishes `count` batches (see publish_batches)."""
    with SlotRing.attach(handle) as ring:
        publish_batches(ring, producer_id, count)


def hold_a_slot_forever(handle, holding) -> None:
    """Takes a slot for writing, says so, and waits to be killed."""
    ring = SlotRing.attach(handle)
    ring.acquire_free(timeout=10.0)
    holding.set()
    time.sleep(60)


def produce_after(handle, attached, go, count: int) -> None:
    """Attaches (and says so), waits for `go`, then publishes `count` slots."""
    with SlotRing.attach(handle) as ring:
        attached.set()
        if not go.wait(timeout=20.0):
            raise SystemExit(3)
        publish_batches(ring, 1, count)


def consume_until_killed(handles) -> None:
    """Creates a one-slot ring, shares its handle, then waits to be killed."""
    ring = SlotRing.create(depth=1, slot_nbytes=SLOT_NBYTES)
    handles.put(ring.handle)
    time.sleep(60)


# ---- helpers ---------------------------------------------------------------------


class Children:
    """Starts processes and makes sure none outlives the test."""

    def __init__(self, method: str) -> None:
        self.context = multiprocessing.get_context(method)
        self.processes = []

    def start(self, target, *args):
        process = self.context.Process(target=target, args=args, daemon=True)
        process.start()
        self.processes.append(process)
        return process

    def kill(self, process) -> None:
        os.kill(process.pid, signal.SIGKILL)
        process.join(timeout=10.0)
        assert process.exitcode == -signal.SIGKILL

    def __enter__(self) -> "Children":
        return self

    def __exit__(self, *exc_info) -> None:
        for process in self.processes:
            if process.is_alive():
                process.kill()
            process.join(timeout=10.0)


# ---- tests -----------------------------------------------------------------------


@pytest.mark.fast
@pytest.mark.parametrize("method", START_METHODS)
def test_several_producers_no_loss_no_duplicates_in_order(method):
    producers, per_producer = 3, 60
    ring = SlotRing.create(depth=4, slot_nbytes=SLOT_NBYTES)
    name = ring.name
    with Children(method) as children, ring:
        for producer_id in range(producers):
            children.start(produce, ring.handle, producer_id, per_producer)
        next_index = {producer_id: 0 for producer_id in range(producers)}
        seen = set()
        for _ in range(producers * per_producer):
            slot, tick = ring.acquire_ready(timeout=20.0)
            producer_id, index = (int(value) for value in ring.slot_array(slot)[:16].view(np.int64))
            assert tick == (producer_id << 32) | index
            assert tick not in seen
            seen.add(tick)
            assert index == next_index[producer_id], "a producer's slots came out of publish order"
            next_index[producer_id] += 1
            assert np.all(ring.slot_array(slot)[16:] == index % 251)
            ring.release(slot)
        for process in children.processes:
            process.join(timeout=20.0)
            assert process.exitcode == 0
        # Everyone closed cleanly (nobody died): nothing more comes, a plain timeout.
        with pytest.raises(TimeoutError):
            ring.acquire_ready(timeout=0.1)
        assert len(seen) == producers * per_producer
    assert not shm_exists(name)


@pytest.mark.parametrize("method", START_METHODS)
def test_killed_producers_slot_is_reclaimed_and_consumer_keeps_going(method):
    # depth 1: the survivor can only publish once the dead producer's slot is reclaimed.
    ring = SlotRing.create(depth=1, slot_nbytes=SLOT_NBYTES)
    name = ring.name
    with Children(method) as children, ring:
        holding = children.context.Event()
        attached = children.context.Event()
        go = children.context.Event()
        victim = children.start(hold_a_slot_forever, ring.handle, holding)
        survivor = children.start(produce_after, ring.handle, attached, go, 5)
        # The survivor attaches before the victim dies, so the consumer always has a
        # live producer to wait for and must not report the ring's peers lost.
        assert holding.wait(timeout=20.0) and attached.wait(timeout=20.0)
        children.kill(victim)
        go.set()
        ticks = []
        for _ in range(5):
            slot, tick = ring.acquire_ready(timeout=20.0)
            ticks.append(tick & 0xFFFFFFFF)
            ring.release(slot)
        assert ticks == [0, 1, 2, 3, 4]
        survivor.join(timeout=20.0)
        assert survivor.exitcode == 0
        start = time.monotonic()
        with pytest.raises(tensorxfer.PeerLost, match=r"exited or closed \(1 died"):
            ring.acquire_ready(timeout=5.0)
        assert time.monotonic() - start < 2.0
    assert not shm_exists(name)


@pytest.mark.parametrize("method", START_METHODS)
def test_consumer_gets_peer_lost_within_its_timeout_when_all_producers_are_killed(method):
    ring = SlotRing.create(depth=2, slot_nbytes=SLOT_NBYTES)
    name = ring.name
    with Children(method) as children, ring:
        holders = []
        for _ in range(2):
            holding = children.context.Event()
            holders.append((children.start(hold_a_slot_forever, ring.handle, holding), holding))
        for _, holding in holders:
            assert holding.wait(timeout=20.0)
        assert ring.live_producers == 2
        for process, _ in holders:
            children.kill(process)
        start = time.monotonic()
        with pytest.raises(tensorxfer.PeerLost):
            ring.acquire_ready(timeout=3.0)
        assert time.monotonic() - start < 1.0
        assert ring.live_producers == 0
    assert not shm_exists(name)


@pytest.mark.parametrize("method", START_METHODS)
def test_producer_gets_peer_lost_when_the_consumer_is_killed(method):
    with Children(method) as children:
        handles = children.context.Queue()
        consumer = children.start(consume_until_killed, handles)
        handle = handles.get(timeout=20.0)
        producer = SlotRing.attach(handle)
        with producer:
            producer.acquire_free(timeout=5.0)  # the only slot
            children.kill(consumer)
            start = time.monotonic()
            with pytest.raises(tensorxfer.PeerLost, match="consumer"):
                producer.acquire_free(timeout=5.0)
            assert time.monotonic() - start < 1.0
            # The survivor removed the dead consumer's segment.
            assert not shm_exists(handle.name)
        with pytest.raises((FileNotFoundError, tensorxfer.PeerLost)):
            SlotRing.attach(handle)
        handles.close()
        handles.join_thread()
