"""SlotRing.abandon and the SlotRing.writing context manager: a producer that
fails after acquire_free hands its slot back without publishing it."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from tensorxfer.ipc import SlotRing


@pytest.fixture
def ring_pair():
    consumer = SlotRing.create(depth=1, slot_nbytes=64, max_producers=4)
    producer = SlotRing.attach(consumer.handle)
    yield consumer, producer
    producer.close()
    consumer.close()


def test_abandon_frees_the_slot_unpublished(ring_pair):
    consumer, producer = ring_pair
    slot = producer.acquire_free(timeout=1.0)
    assert producer.try_acquire_free() is None  # the only slot is ours
    producer.abandon(slot)
    assert consumer.try_acquire_ready() is None
    assert producer.acquire_free(timeout=1.0) == slot  # free again at once
    producer.publish(slot, tick_id=3)
    assert consumer.acquire_ready(timeout=1.0) == (slot, 3)
    assert consumer.skipped_sequences == 0


def test_abandon_refuses_slots_not_held_for_writing(ring_pair):
    consumer, producer = ring_pair
    other = SlotRing.attach(consumer.handle)
    try:
        slot = producer.acquire_free(timeout=1.0)
        with pytest.raises(ValueError, match="not held by this producer"):
            other.abandon(slot)
        with pytest.raises(ValueError, match="not held by this producer"):
            consumer.abandon(slot)
        with pytest.raises(ValueError, match=r"slot must be in \[0, 1\), got 1"):
            producer.abandon(1)
        with pytest.raises(TypeError, match="slot must be an int"):
            producer.abandon("0")
        producer.publish(slot, tick_id=1)
        with pytest.raises(ValueError, match="not held by this producer"):
            producer.abandon(slot)  # published: the consumer's now
    finally:
        other.close()


def test_abandon_wakes_a_waiting_producer(ring_pair):
    consumer, producer = ring_pair
    other = SlotRing.attach(consumer.handle)
    got = []
    try:
        slot = producer.acquire_free(timeout=1.0)
        waiter = threading.Thread(target=lambda: got.append(other.acquire_free(timeout=5.0)))
        waiter.start()
        producer.abandon(slot)
        waiter.join(timeout=5.0)
        assert got == [slot]
    finally:
        other.close()


def test_writing_publishes_when_the_block_succeeds(ring_pair):
    consumer, producer = ring_pair
    with producer.writing(tick_id=42, timeout=1.0) as slot:
        producer.slot_array(slot)[:4] = np.arange(4, dtype=np.uint8)
    got_slot, tick = consumer.acquire_ready(timeout=1.0)
    assert (got_slot, tick) == (slot, 42)
    assert consumer.slot_array(got_slot)[:4].tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize("error", [RuntimeError("collector failed"), KeyboardInterrupt()])
def test_writing_abandons_when_the_block_raises(ring_pair, error):
    consumer, producer = ring_pair
    with pytest.raises(type(error)):
        with producer.writing(tick_id=1, timeout=1.0) as slot:
            producer.slot_array(slot)[:] = 7
            raise error
    assert consumer.try_acquire_ready() is None  # never published
    assert producer.acquire_free(timeout=1.0) == slot  # handed back, not leaked
    producer.abandon(slot)


def test_writing_checks_tick_id_before_taking_a_slot(ring_pair):
    _, producer = ring_pair
    with pytest.raises(ValueError, match="tick_id"):
        with producer.writing(tick_id=-1):
            pass
    with pytest.raises(TypeError, match="tick_id"):
        with producer.writing(tick_id=1.5):
            pass
    assert producer.try_acquire_free() is not None  # nothing was taken


def test_writing_times_out_like_acquire_free(ring_pair):
    _, producer = ring_pair
    producer.acquire_free(timeout=1.0)
    with pytest.raises(TimeoutError):
        with producer.writing(tick_id=1, timeout=0.05):
            pytest.fail("the block ran without a slot")
