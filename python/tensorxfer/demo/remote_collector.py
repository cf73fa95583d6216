"""A demo collector on another host: the same batches as a local collector, sent to the learner's
ring over torch.distributed (``tensorxfer.ipc.remote``).

It builds its own copy of the replay store from the seed (in its own host's memory), so the
learner's check of every batch against its store also checks that the two hosts agree.

Run by the demo (``--remote-collectors N``), or by hand on another machine::

    python -m tensorxfer.demo.remote_collector --connect tcp://LEARNER:PORT --collector-id 2 \\
        --num-collectors 4 [--store-rows ... --obs-dim ... --batch-rows ... --seed ...]

with the options the learner printed.  It exits 0 when the learner closes its ring.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from typing import Optional, Sequence

import numpy as np

from tensorxfer.demo import store as replay_store

_POLL_S = 0.1


def run(connect: str, collector_id: int, num_collectors: int, store_rows: int, obs_dim: int, batch_rows: int,
        seed: int, timeout: float = 60.0) -> int:
    """Produces batches until the learner closes; returns how many it published."""
    from tensorxfer.errors import PeerLostError
    from tensorxfer.ipc import pack_rows
    from tensorxfer.ipc.remote import RemoteSlotRing

    layout = replay_store.batch_layout(obs_dim, batch_rows)
    payload_end = replay_store.PAYLOAD_OFFSET + layout.nbytes
    published = 0
    with replay_store.ReplayStore.create(store_rows, obs_dim, seed) as store:
        producer = RemoteSlotRing.connect(connect, name=f"collector-{collector_id}", timeout=timeout)
        if producer.slot_nbytes < payload_end:
            producer.close()
            raise ValueError(f"the learner's slots hold {producer.slot_nbytes} bytes, a batch needs {payload_end}: "
                             "start both with the same --obs-dim and --batch-rows")
        sources = store.arrays
        try:
            while True:
                tick = replay_store.collector_tick(collector_id, num_collectors, published)
                indices = replay_store.batch_indices(seed, tick, batch_rows, store.rows)
                try:
                    slot = producer.acquire_free(timeout=_POLL_S)
                except TimeoutError:
                    continue
                view = producer.slot_array(slot)
                pack_rows(view[replay_store.PAYLOAD_OFFSET:payload_end], layout, sources=sources, indices=indices)
                header = view[: replay_store.PAYLOAD_OFFSET].view(np.int64)
                header[replay_store.HEADER_TICK] = tick
                header[replay_store.HEADER_COLLECTOR] = collector_id
                header[replay_store.HEADER_ROWS] = batch_rows
                header[replay_store.HEADER_MAGIC] = replay_store.HEADER_MAGIC_VALUE
                header[replay_store.HEADER_PUBLISH_NS] = time.monotonic_ns()
                producer.publish(slot, tick, nbytes=payload_end)
                published += 1
        except PeerLostError:
            pass  # the learner closed (or went away): the demo is over
        finally:
            producer.close()
    return published


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--connect", required=True, help="the learner's init_method, tcp://HOST:PORT")
    add("--collector-id", type=int, required=True)
    add("--num-collectors", type=int, required=True)
    add("--store-rows", type=int, default=65536)
    add("--obs-dim", type=int, default=256)
    add("--batch-rows", type=int, default=512)
    add("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the learner stops us by closing its ring
    run(args.connect, args.collector_id, args.num_collectors, args.store_rows, args.obs_dim, args.batch_rows,
        args.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
