"""The host backend on real shared slots: a producer process fills SlotRing slots, the
learner registers them (pre-fault + page-lock in place) and copies every batch out."""

from __future__ import annotations

import multiprocessing

import numpy as np
import pytest

from tensorxfer.ipc import SlotRing
from tensorxfer.ipc.replay_pipelines import ReplayTickMetadata
from tensorxfer.ipc.replay_pipelines.transfer import build_replay_transfer_backend

pytestmark = pytest.mark.multiprocess

DEPTH = 3
BATCH_NBYTES = 256 << 10
BATCHES = 24


def batch_for(tick: int) -> np.ndarray:
    return np.random.default_rng(tick).integers(0, 255, size=BATCH_NBYTES, dtype=np.uint8)


def produce(handle, batches: int) -> None:
    with SlotRing.attach(handle) as ring:
        for tick in range(batches):
            slot = ring.acquire_free(timeout=30.0)
            ring.slot_array(slot)[:BATCH_NBYTES] = batch_for(tick)
            ring.publish(slot, tick_id=tick)


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_learner_copies_every_published_batch(start_method):
    context = multiprocessing.get_context(start_method)
    ring = SlotRing.create(depth=DEPTH, slot_nbytes=BATCH_NBYTES + 4096)
    # The producer starts before the backend's threads exist (fork of a threaded process is unsafe).
    producer = context.Process(target=produce, args=(ring.handle, BATCHES))
    producer.start()
    backend = None
    try:
        backend = build_replay_transfer_backend(device="cpu", ring_depth=DEPTH)
        # Registering while the producer writes: pre-faulting and locking never change content.
        backend.register_host_slots([array[:BATCH_NBYTES] for array in ring.slot_arrays()])
        device_slots = backend.allocate_device_slots(count=DEPTH, shape=BATCH_NBYTES, dtype=np.uint8)
        for step in range(BATCHES):
            host_slot, tick = ring.acquire_ready(timeout=30.0)
            device_slot = step % DEPTH
            source = ring.slot_array(host_slot)[:BATCH_NBYTES]
            metadata = ReplayTickMetadata(
                tick_id=tick, snapshot_ptr=source.ctypes.data, snapshot_size=BATCH_NBYTES, sample_seed=tick,
                sample_count=1, batch_host_slot=host_slot, batch_gpu_slot=device_slot,
            )
            backend.submit_h2d(slot=host_slot, dst=device_slots[device_slot], src=source, metadata=metadata)
            backend.synchronize_ready(host_slot)
            ring.release(host_slot)  # the copy is done: the producer may refill the slot
            assert tick == step
            np.testing.assert_array_equal(device_slots[device_slot], batch_for(tick))
        producer.join(timeout=30.0)
        assert producer.exitcode == 0
    finally:
        if producer.is_alive():
            producer.kill()
            producer.join()
        # The ring goes first on purpose: the backend must not keep its slots mapped.
        ring.close()
        if backend is not None:
            backend.close()
    assert not backend.host_pinned
