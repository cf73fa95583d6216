"""tensorxfer.ipc.SlotRing in one process: API, views, errors, timeouts, close."""

from __future__ import annotations

import math
import os
import pickle
import threading
import time

import numpy as np
import pytest

import tensorxfer
from tensorxfer.ipc import SlotRing, SlotRingHandle
from tensorxfer.ipc.shared_array import SharedArray

from conftest import torch_or_skip


def shm_path(name: str) -> str:
    return "/dev/shm/" + name.lstrip("/")


@pytest.fixture
def ring():
    with SlotRing.create(depth=4, slot_nbytes=256) as created:
        yield created


@pytest.fixture
def producer(ring):
    with SlotRing.attach(ring.handle) as attached:
        yield attached


def test_handoff_carries_bytes_and_tick(ring, producer):
    slot = producer.acquire_free(timeout=1.0)
    assert isinstance(slot, int) and 0 <= slot < 4
    producer.slot_array(slot)[:] = np.arange(256, dtype=np.uint8)
    before = time.monotonic_ns()
    producer.publish(slot, tick_id=7)
    got_slot, tick = ring.acquire_ready(timeout=1.0)
    assert (got_slot, tick) == (slot, 7)
    assert ring.slot_array(got_slot).tolist() == list(range(256))
    assert before <= ring.last_publish_ns <= time.monotonic_ns()
    ring.release(got_slot)
    assert ring.try_acquire_ready() is None


def test_properties_and_handle(ring, producer):
    assert (ring.depth, ring.slot_nbytes) == (4, 256)
    assert ring.is_consumer and not producer.is_consumer
    assert ring.name.startswith(f"/tensorxfer-{os.getpid()}-")
    handle = ring.handle
    assert handle == SlotRingHandle(ring.name, 4, 256)
    assert pickle.loads(pickle.dumps(handle)) == handle
    assert len(pickle.dumps(handle)) < 300
    assert producer.name == ring.name
    assert ring.live_producers == 1
    assert os.stat(shm_path(ring.name)).st_mode & 0o777 == 0o600
    assert "consumer" in repr(ring) and "producer" in repr(producer)


def test_slot_views_are_zero_copy_and_page_aligned(ring, producer):
    views = producer.slot_arrays()
    assert len(views) == 4
    for index, view in enumerate(views):
        assert view.dtype == np.uint8 and view.shape == (256,)
        assert view.ctypes.data % 4096 == 0
        view[:] = index + 1
    assert [int(view[0]) for view in ring.slot_arrays()] == [1, 2, 3, 4]
    assert ring.slot_array(2).ctypes.data != producer.slot_array(2).ctypes.data  # two mappings, same bytes


def test_slot_tensor_shares_memory_with_the_slot(ring, producer):
    torch = torch_or_skip()
    slot = producer.acquire_free(timeout=1.0)
    tensor = producer.slot_tensor(slot)
    assert tensor.dtype == torch.uint8 and tuple(tensor.shape) == (256,)
    assert tensor.data_ptr() == producer.slot_array(slot).ctypes.data
    tensor.fill_(9)
    producer.publish(slot, tick_id=1)
    got, _ = ring.acquire_ready(timeout=1.0)
    assert int(ring.slot_tensor(got).sum()) == 9 * 256


def test_consumer_sees_publish_order_across_producers(ring, producer):
    with SlotRing.attach(ring.handle) as other:
        a = producer.acquire_free(timeout=1.0)
        b = other.acquire_free(timeout=1.0)
        c = producer.acquire_free(timeout=1.0)
        other.publish(b, tick_id=1)
        producer.publish(c, tick_id=2)
        producer.publish(a, tick_id=3)
        assert [ring.acquire_ready(timeout=1.0) for _ in range(3)] == [(b, 1), (c, 2), (a, 3)]


def test_bad_arguments_are_refused(ring, producer):
    for depth in (0, 1025, -1):
        with pytest.raises(ValueError, match="depth"):
            SlotRing.create(depth=depth, slot_nbytes=64)
    with pytest.raises(TypeError, match="depth must be an int"):
        SlotRing.create(depth=2.5, slot_nbytes=64)
    with pytest.raises(ValueError, match="slot_nbytes"):
        SlotRing.create(depth=2, slot_nbytes=0)
    with pytest.raises(ValueError, match="spin_us"):
        SlotRing.create(depth=2, slot_nbytes=8, spin_us=-1)
    with pytest.raises(ValueError, match="max_producers"):
        SlotRing.create(depth=2, slot_nbytes=8, max_producers=0)
    with pytest.raises(ValueError, match=r"slot must be in \[0, 4\), got 4"):
        producer.publish(4, tick_id=1)
    with pytest.raises(ValueError, match="slot must be"):
        producer.slot_array(-1)
    with pytest.raises(ValueError, match="not held by this producer"):
        producer.publish(0, tick_id=1)
    slot = producer.acquire_free(timeout=1.0)
    with pytest.raises(ValueError, match="tick_id"):
        producer.publish(slot, tick_id=-1)
    producer.publish(slot, tick_id=2**64 - 1)
    with pytest.raises(ValueError, match="not held by this producer"):
        producer.publish(slot, tick_id=1)  # twice
    with pytest.raises(ValueError, match="not held by the consumer"):
        ring.release(slot)  # READY, not yet acquired
    with pytest.raises(ValueError, match="only the ring's creator consumes"):
        producer.acquire_ready(timeout=0.01)
    with pytest.raises(ValueError, match="only the ring's creator consumes"):
        producer.release(slot)
    assert ring.acquire_ready(timeout=1.0) == (slot, 2**64 - 1)
    ring.release(slot)
    with pytest.raises(ValueError, match="not held by the consumer"):
        ring.release(slot)  # twice
    for timeout in (-1.0, math.nan):
        with pytest.raises(ValueError, match="timeout"):
            ring.acquire_ready(timeout=timeout)
    with pytest.raises(TypeError, match="timeout"):
        ring.acquire_ready(timeout="1")
    with pytest.raises(TypeError, match="handle"):
        SlotRing.attach(42)


def test_waits_time_out(ring, producer):
    start = time.monotonic()
    with pytest.raises(TimeoutError, match="nothing was published within 0.050 s"):
        ring.acquire_ready(timeout=0.05)
    assert 0.045 <= time.monotonic() - start < 1.0
    for _ in range(4):
        producer.acquire_free(timeout=1.0)
    assert producer.try_acquire_free() is None
    start = time.monotonic()
    with pytest.raises(TimeoutError, match="no slot became free"):
        producer.acquire_free(timeout=0.03)
    assert 0.025 <= time.monotonic() - start < 1.0
    with pytest.raises(TimeoutError):
        ring.acquire_ready(timeout=0)


def test_waits_release_the_gil(ring, producer):
    result = {}

    def consume():
        result["ready"] = ring.acquire_ready(timeout=5.0)

    waiter = threading.Thread(target=consume)
    waiter.start()
    # This thread keeps running Python while the other waits: the GIL is free.
    deadline = time.monotonic() + 0.1
    spins = 0
    while time.monotonic() < deadline:
        spins += 1
    slot = producer.acquire_free(timeout=1.0)
    producer.publish(slot, tick_id=11)
    waiter.join(timeout=5.0)
    assert not waiter.is_alive()
    assert result["ready"] == (slot, 11)
    assert spins > 1000


def test_spin_budget_is_configurable(ring):
    assert ring.spin_us is None
    # The standard policy: milliseconds while a producer and the consumer fit the CPUs, else 20 us.
    assert ring.current_spin_us == (2000.0 if len(os.sched_getaffinity(0)) >= 2 else 20.0)
    ring.spin_us = 0
    assert ring.spin_us == 0 and ring.current_spin_us == 0
    ring.spin_us = 150
    assert ring.spin_us == 150 and ring.current_spin_us == 150
    ring.spin_us = None
    assert ring.spin_us is None
    with pytest.raises(ValueError, match="spin_us"):
        ring.spin_us = 2_000_000
    with SlotRing.create(depth=1, slot_nbytes=8, spin_us=0) as quiet:
        assert quiet.spin_us == 0
        with SlotRing.attach(quiet.handle, spin_us=25) as peer:
            assert peer.spin_us == 25


def test_close_is_idempotent_and_later_calls_fail():
    ring = SlotRing.create(depth=2, slot_nbytes=64)
    producer = SlotRing.attach(ring.handle)
    name = ring.name
    slot = producer.acquire_free(timeout=1.0)
    view = producer.slot_array(slot)
    producer.close()
    producer.close()
    assert producer.closed
    calls = [
        lambda: producer.acquire_free(timeout=0.01),
        lambda: producer.try_acquire_free(),
        lambda: producer.publish(slot, tick_id=1),
        lambda: producer.slot_array(slot),
        lambda: producer.slot_arrays(),
        lambda: producer.handle,
        lambda: producer.release(slot),
        lambda: producer.acquire_ready(timeout=0.01),
        lambda: producer.try_acquire_ready(),
    ]
    for call in calls:
        with pytest.raises(ValueError, match="ring is closed"):
            call()
    view[0] = 1  # views keep their mapping: no crash after close
    # The closed producer gave its slot back.
    with SlotRing.attach(ring.handle) as other:
        assert sorted([other.acquire_free(timeout=1.0), other.acquire_free(timeout=1.0)]) == [0, 1]
    ring.close()
    ring.close()
    assert not os.path.exists(shm_path(name))
    with pytest.raises(ValueError, match="ring is closed"):
        ring.acquire_ready(timeout=0.01)


def test_context_manager_removes_the_segment():
    with SlotRing.create(depth=2, slot_nbytes=64) as ring:
        name = ring.name
        assert os.path.exists(shm_path(name))
    assert ring.closed
    assert not os.path.exists(shm_path(name))
    with pytest.raises(FileNotFoundError):
        SlotRing.attach(name)


def test_segment_is_removed_after_an_exception():
    name = None
    with pytest.raises(RuntimeError):
        with SlotRing.create(depth=2, slot_nbytes=64) as ring:
            name = ring.name
            raise RuntimeError("boom")
    assert not os.path.exists(shm_path(name))


def test_producer_gets_peer_lost_when_the_consumer_closes(ring, producer):
    for _ in range(4):
        producer.acquire_free(timeout=1.0)
    threading.Timer(0.05, ring.close).start()
    start = time.monotonic()
    with pytest.raises(tensorxfer.PeerLost, match="closed the ring"):
        producer.acquire_free(timeout=5.0)
    assert time.monotonic() - start < 2.0


def test_producers_closing_cleanly_are_not_lost(ring, producer):
    producer.close()
    # Nobody died: another producer may still attach, so this is a plain timeout.
    with pytest.raises(TimeoutError):
        ring.acquire_ready(timeout=0.1)
    with SlotRing.attach(ring.handle) as late:
        slot = late.acquire_free(timeout=1.0)
        late.publish(slot, tick_id=3)
    assert ring.acquire_ready(timeout=1.0) == (slot, 3)


def test_no_producer_yet_is_a_timeout_not_peer_lost():
    with SlotRing.create(depth=2, slot_nbytes=64) as ring:
        with pytest.raises(TimeoutError):
            ring.acquire_ready(timeout=0.05)


def test_rings_cannot_be_pickled(ring):
    with pytest.raises(TypeError, match="ring.handle"):
        pickle.dumps(ring)


def test_attach_refuses_a_handle_that_does_not_match(ring):
    with pytest.raises(tensorxfer.CorruptSegmentError, match="expected"):
        SlotRing.attach(SlotRingHandle(ring.name, 8, 256))
    assert ring.live_producers == 0  # the refused attachment detached again


def test_attach_refuses_other_segments_and_corruption():
    with SharedArray.create((16,), "uint8") as array:
        with pytest.raises(tensorxfer.CorruptSegmentError, match="expected 'RING'"):
            SlotRing.attach(array.name)
    with SlotRing.create(depth=2, slot_nbytes=64) as ring:
        with open(shm_path(ring.name), "r+b") as file:
            file.seek(4096 + 8)  # the ring header's depth field
            file.write(b"\xff")
        with pytest.raises(tensorxfer.CorruptSegmentError):
            SlotRing.attach(ring.handle)
        full_size = os.stat(shm_path(ring.name)).st_size
        with open(shm_path(ring.name), "r+b") as file:
            file.truncate(100)
        try:
            with pytest.raises(tensorxfer.CorruptSegmentError, match="expected at least 4096"):
                SlotRing.attach(ring.handle)
        finally:
            # Our own mapping would fault on the missing pages (a same-user peer
            # shrinking a segment is outside what validation can catch).
            with open(shm_path(ring.name), "r+b") as file:
                file.truncate(full_size)
    with pytest.raises(ValueError, match="segment name"):
        SlotRing.attach("/etc/passwd")
