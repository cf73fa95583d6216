"""The soak's worker processes (``python soak_roles.py ROLE JSON``): collectors and trainer ranks.

* ``local``: a collector attached to the learner's ring in shared memory.
* ``remote``: a collector on a simulated other host (its own store copy; over
  ``tensorxfer.ipc.remote``).
* ``rank``: one of two trainer ranks: every ``refit_ms`` a persistent-plan refit (shm service,
  strided and contiguous tensors, checked), and between refits ``all_reduce`` through the
  ``"tensorxfer"`` torch.distributed backend over a cycle of sizes from 1 element to 4 Mi
  (checked against the exact sum).

Batches carry tick ids ``collector << 40 | incarnation << 24 | sequence`` (the store rows of
a batch follow from its tick, as in the replay demo), so the learner checks every byte and,
per incarnation of a collector, that the sequences arrive whole and in order. A local
collector also counts its completed publishes in a file (``counter``), so a batch published
and then lost is caught even when it is the last one before a SIGKILL.
"""

from __future__ import annotations

import base64
import json
import os
import pickle
import signal
import sys
import time
import traceback
from typing import Any, Dict

import numpy as np

from tensorxfer.demo import store as replay_store

_POLL_S = 0.1


def tick_of(collector: int, incarnation: int, sequence: int) -> int:
    return collector << 40 | incarnation << 24 | sequence


def split_tick(tick: int) -> tuple:
    return tick >> 40, (tick >> 24) & 0xFFFF, tick & 0xFFFFFF


def _fill(view: np.ndarray, layout: Any, sources: Dict[str, np.ndarray], spec: Dict[str, Any], tick: int) -> int:
    from tensorxfer.ipc import pack_rows

    payload_end = replay_store.PAYLOAD_OFFSET + layout.nbytes
    indices = replay_store.batch_indices(spec["seed"], tick, spec["batch_rows"], spec["store_rows"])
    pack_rows(view[replay_store.PAYLOAD_OFFSET:payload_end], layout, sources=sources, indices=indices)
    header = view[: replay_store.PAYLOAD_OFFSET].view(np.int64)
    header[replay_store.HEADER_TICK] = tick
    header[replay_store.HEADER_COLLECTOR] = spec["collector"]
    header[replay_store.HEADER_ROWS] = spec["batch_rows"]
    header[replay_store.HEADER_MAGIC] = replay_store.HEADER_MAGIC_VALUE
    header[replay_store.HEADER_PUBLISH_NS] = time.monotonic_ns()
    return payload_end


def local_collector(spec: Dict[str, Any]) -> None:
    from tensorxfer.errors import PeerLostError
    from tensorxfer.ipc import SlotRing

    counter = np.memmap(spec["counter"], dtype=np.int64, mode="r+", shape=(1,))
    layout = replay_store.batch_layout(spec["obs_dim"], spec["batch_rows"])
    ring = SlotRing.attach(spec["ring"])
    store = replay_store.ReplayStore.attach(pickle.loads(base64.b64decode(spec["store"])))
    sources = store.arrays
    sequence = 0
    try:
        while not os.path.exists(spec["stop"]):
            try:
                slot = ring.acquire_free(timeout=_POLL_S)
            except TimeoutError:
                continue
            _fill(ring.slot_array(slot), layout, sources, spec, tick_of(spec["collector"], spec["incarnation"],
                                                                        sequence))
            ring.publish(slot, tick_of(spec["collector"], spec["incarnation"], sequence))
            sequence += 1
            counter[0] = sequence  # after publish returned: a kill between the two undercounts, never over
            time.sleep(spec["pause_s"])
    except PeerLostError:
        pass
    finally:
        store.close()
        ring.close()


def remote_collector(spec: Dict[str, Any]) -> None:
    from tensorxfer.errors import PeerLostError
    from tensorxfer.ipc.remote import RemoteSlotRing

    layout = replay_store.batch_layout(spec["obs_dim"], spec["batch_rows"])
    with replay_store.ReplayStore.create(spec["store_rows"], spec["obs_dim"], spec["seed"]) as store:
        producer = RemoteSlotRing.connect(spec["init_method"], name=f"collector-{spec['collector']}", timeout=60.0)
        sources = store.arrays
        sequence = 0
        try:
            while not os.path.exists(spec["stop"]):
                try:
                    slot = producer.acquire_free(timeout=_POLL_S)
                except TimeoutError:
                    continue
                tick = tick_of(spec["collector"], spec["incarnation"], sequence)
                nbytes = _fill(producer.slot_array(slot), layout, sources, spec, tick)
                producer.publish(slot, tick, nbytes=nbytes)
                sequence += 1
                time.sleep(spec["pause_s"])
        except PeerLostError:
            pass
        finally:
            producer.close()


# ---- trainer ranks -----------------------------------------------------------------------------------

ALL_REDUCE_SIZES = [1, 2, 3, 7, 64, 255, 1024, 4097, 1 << 14, 1 << 16, 100_003, 1 << 18, 1 << 20, 1 << 22]


def _refit_tensors(rank: int) -> Any:
    """Sources on this rank and destinations on the other: contiguous, strided (a transposed view) and
    a slice, 4 KiB to 2 MiB."""
    import torch

    shapes = [(1024,), (256, 512), (64, 1000), (4096, 128)]
    sources = [torch.zeros(shape, dtype=torch.float32) for shape in shapes]
    base = [torch.zeros(shape[::-1] if len(shape) == 2 else shape, dtype=torch.float32) for shape in shapes]
    destinations = [b.t() if b.dim() == 2 else b for b in base]  # strided views where 2-D
    return sources, destinations


def rank_main(spec: Dict[str, Any]) -> Dict[str, Any]:
    import torch
    import torch.distributed as dist

    from tensorxfer.resharding.copy_services import build_copy_service
    from tensorxfer.resharding.persistent_plan import build_persistent_plan

    rank = spec["rank"]
    dist.init_process_group("tensorxfer", init_method=f"file://{spec['rendezvous']}", rank=rank, world_size=2)
    gloo = dist.new_group([0, 1], backend="gloo")
    peer = 1 - rank
    sources, destinations = _refit_tensors(rank)
    sends = [(rank * 100 + i, tensor, peer) for i, tensor in enumerate(sources)]
    recvs = [(peer * 100 + i, tensor, peer) for i, tensor in enumerate(destinations)]
    status: Dict[str, Any] = {"refits": 0, "all_reduces": 0, "error": None}
    service = build_copy_service("shm", group=gloo, timeout=60)
    plan = build_persistent_plan(service, sends, recvs)
    # The loop's own tensors are made once: a new 16 MiB tensor per step let glibc's dynamic
    # mmap threshold rise to that size, and the rank's heap then held up to 200 MiB more or less
    # from one minute to the next (measured: rank RSS 386-513 MiB in a 10-minute run, 267-308
    # MiB with MALLOC_MMAP_THRESHOLD_ fixed), which the growth check read as the library's.
    all_reduce_buffers = {size: (torch.arange(size, dtype=torch.float32) % 97, torch.empty(size), torch.empty(size))
                          for size in ALL_REDUCE_SIZES}
    next_refit = time.monotonic()
    step = 0
    last_report = 0.0
    try:
        while True:
            # Both ranks decide together (each by its own clock, then the larger): leave, or refit now.
            flags = torch.tensor([1 if os.path.exists(spec["stop"]) else 0,
                                  1 if time.monotonic() >= next_refit else 0], dtype=torch.int64)
            dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=gloo)
            if int(flags[0]) != 0:
                break
            if int(flags[1]) != 0:
                version = status["refits"]
                for i, tensor in enumerate(sources):
                    tensor.fill_(float(version * 10 + rank * 1000 + i))
                plan.run(version=version)
                for i, tensor in enumerate(destinations):
                    expected = float(version * 10 + peer * 1000 + i)
                    if not bool(torch.all(tensor == expected)):
                        raise AssertionError(f"refit {version}: destination {i} is not {expected}")
                status["refits"] += 1
                next_refit = max(next_refit + spec["refit_ms"] / 1000, time.monotonic())
            size = ALL_REDUCE_SIZES[step % len(ALL_REDUCE_SIZES)]
            pattern, values, expected = all_reduce_buffers[size]
            torch.add(pattern, rank * 3 + step % 5, out=values)
            dist.all_reduce(values)
            torch.add(pattern, pattern, out=expected).add_(3 + 2 * (step % 5))
            if not torch.equal(values, expected):
                raise AssertionError(f"all_reduce of {size} elements (step {step}) differs from the exact sum")
            status["all_reduces"] += 1
            step += 1
            if time.monotonic() - last_report > 2:
                last_report = time.monotonic()
                _write(spec["status"], status)
    except BaseException:  # noqa: BLE001 - reported through the status file
        status["error"] = traceback.format_exc()
        _write(spec["status"], status)
        raise
    plan.close()
    service.close()
    dist.destroy_process_group()
    _write(spec["status"], status)
    return status


def _write(path: str, content: Dict[str, Any]) -> None:
    with open(path + ".tmp", "w") as out:
        json.dump(content, out)
    os.replace(path + ".tmp", path)


ROLES = {"local": local_collector, "remote": remote_collector, "rank": rank_main}

if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the soak stops its workers with its stop file
    role, arguments = sys.argv[1], json.loads(sys.argv[2])
    ROLES[role](arguments)
