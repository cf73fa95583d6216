"""A demo collector process: samples seeded batches from the store and packs them into the ring."""

from __future__ import annotations

import dataclasses
import signal
import time
from typing import Any, Dict

import numpy as np

from tensorxfer.demo import store as replay_store

# How long one wait for a free slot lasts before the stop flag is checked again.
_POLL_S = 0.1


@dataclasses.dataclass(frozen=True)
class CollectorConfig:
    """What one collector needs; picklable, so it crosses a spawn boundary."""

    collector_id: int
    num_collectors: int
    ring_handle: Any
    store_handles: Dict[str, Any]
    obs_dim: int
    batch_rows: int
    seed: int


def run_collector(config: CollectorConfig, ready: Any, stop: Any) -> None:
    """Process entry point: attach, set ``ready``, produce batches until ``stop`` is set.

    Ctrl-C is left to the learner (it stops us through ``stop``), so every
    collector detaches its segments on the way out.  A learner that dies makes
    ``acquire_free`` raise ``PeerLostError``; the collector then exits quietly.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from tensorxfer.errors import PeerLostError
    from tensorxfer.ipc import SlotRing, pack_rows

    ring = SlotRing.attach(config.ring_handle)
    try:
        store = replay_store.ReplayStore.attach(config.store_handles)
        try:
            layout = replay_store.batch_layout(config.obs_dim, config.batch_rows)
            ready.set()
            _produce(config, ring, store, layout, pack_rows, stop)
        except PeerLostError:
            pass
        finally:
            store.close()
    finally:
        ring.close()


def _produce(config: CollectorConfig, ring: Any, store: Any, layout: Any, pack_rows: Any, stop: Any) -> None:
    sources = store.arrays
    store_rows = store.rows
    payload_end = replay_store.PAYLOAD_OFFSET + layout.nbytes
    sequence = 0
    while not stop.is_set():
        tick = replay_store.collector_tick(config.collector_id, config.num_collectors, sequence)
        indices = replay_store.batch_indices(config.seed, tick, config.batch_rows, store_rows)
        try:
            slot = ring.acquire_free(timeout=_POLL_S)
        except TimeoutError:
            continue  # the learner is busy; look at the stop flag, then try again (same tick)
        view = ring.slot_array(slot)
        pack_rows(view[replay_store.PAYLOAD_OFFSET:payload_end], layout, sources=sources, indices=indices)
        header = view[: replay_store.PAYLOAD_OFFSET].view(np.int64)
        header[replay_store.HEADER_TICK] = tick
        header[replay_store.HEADER_COLLECTOR] = config.collector_id
        header[replay_store.HEADER_ROWS] = config.batch_rows
        header[replay_store.HEADER_MAGIC] = replay_store.HEADER_MAGIC_VALUE
        header[replay_store.HEADER_PUBLISH_NS] = time.monotonic_ns()
        ring.publish(slot, tick_id=tick)
        sequence += 1
