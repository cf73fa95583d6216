"""Processes of the remote-ring tests: a learner, remote producers, a local producer.

Each runs as ``python remote_ring_workers.py ROLE JSON`` (in a simulated host, entered with
nsenter) and writes what it saw to ``JSON["result"]`` as JSON.  Slot contents are a function
of the tick id (:func:`fill` / :func:`matches`), so the learner checks every byte of every slot.
Tick ids are ``producer_number << 32 | k``: the learner checks each producer's order with them.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from typing import Any, Dict, List

import numpy as np

_MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)


def fill(array: np.ndarray, tick_id: int, nbytes: int) -> None:
    """The first ``nbytes`` (a multiple of 8) of ``array``: word i is i * golden + tick_id."""
    words = array[:nbytes].view(np.uint64)
    np.multiply(np.arange(words.size, dtype=np.uint64), _MULTIPLIER, out=words)
    words += np.uint64(tick_id)


def matches(array: np.ndarray, tick_id: int, nbytes: int) -> bool:
    expected = np.empty(nbytes, dtype=np.uint8)
    fill(expected, tick_id, nbytes)
    return bool(np.array_equal(array[:nbytes], expected))


def write_result(path: str, result: Dict[str, Any]) -> None:
    with open(path + ".tmp", "w") as out:
        json.dump(result, out)
    os.replace(path + ".tmp", path)


def wait_for_file(path: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {timeout} s")
        time.sleep(0.02)
    with open(path) as source:
        return source.read()


# ---- the learner ----------------------------------------------------------------------------


def learner(spec: Dict[str, Any]) -> Dict[str, Any]:
    from tensorxfer.errors import PeerLostError
    from tensorxfer.ipc import SlotRing
    from tensorxfer.ipc.remote import RemoteProducers

    ring = SlotRing.create(spec["depth"], spec["slot_nbytes"])
    remote = RemoteProducers.serve(ring, "tcp://127.0.0.1:0", credits=spec["credits"], timeout=spec["timeout"])
    local = None
    if spec.get("local_count"):
        import subprocess

        local_spec = {"ring": ring.name, "count": spec["local_count"], "number": 0,
                      "result": spec["result"] + ".local", "slot_nbytes": spec["slot_nbytes"]}
        local = subprocess.Popen([sys.executable, __file__, "local", json.dumps(local_spec)])
    write_result(spec["address_file"], {"init_method": remote.init_method, "ring": ring.name, "pid": os.getpid()})
    received: Dict[str, List[int]] = {}
    losses: List[List[Any]] = []
    corrupt: List[int] = []
    expected = spec.get("expect", {})  # producer number -> slots
    losses_expected = spec.get("losses", 0)
    deadline = time.monotonic() + spec.get("seconds", 60)
    if spec.get("wait_producers"):
        remote.wait_for_producers(spec["wait_producers"], timeout=60.0)
    time.sleep(spec.get("hold_s", 0))  # a learner that does not consume yet: producers must block
    total = 0
    while time.monotonic() < deadline:
        try:
            slot, tick_id = ring.acquire_ready(timeout=0.2)
        except TimeoutError:
            # Without expectations the learner runs until close_after, its seconds, or its kill (a quiet
            # moment while producers start is not the end).
            done = bool(expected) and all(len(received.get(str(number), [])) >= count
                                          for number, count in expected.items())
            if done and len(losses) >= losses_expected:
                break
            continue
        except PeerLostError as error:
            losses.append([time.monotonic(), str(error)])
            continue
        if not matches(ring.slot_array(slot), tick_id, spec["slot_nbytes"]):
            corrupt.append(tick_id)
        ring.release(slot)
        received.setdefault(str(tick_id >> 32), []).append(tick_id & 0xFFFFFFFF)
        total += 1
        if spec.get("close_after") and total >= spec["close_after"]:
            break
    closed_at = time.monotonic()
    stats = [vars(record).copy() for record in remote.stats]
    remote.close()
    ring.close()
    local_exit = local.wait(30) if local is not None else None
    return {"received": received, "losses": losses, "corrupt": corrupt, "stats": stats, "closed_at": closed_at,
            "local_exit": local_exit}


# ---- producers -------------------------------------------------------------------------------


def remote_producer(spec: Dict[str, Any]) -> Dict[str, Any]:
    from tensorxfer.errors import PeerLostError
    from tensorxfer.ipc.remote import RemoteSlotRing

    producer = RemoteSlotRing.connect(spec["init_method"], name=spec["name"], timeout=30.0)
    number, nbytes = spec["number"], producer.slot_nbytes
    result: Dict[str, Any] = {"published": 0, "refused": [], "blocked_after": None, "error": None}
    if spec.get("bad_input"):
        slot = producer.acquire_free(timeout=10.0)
        for kwargs in ({"tick_id": number << 32, "nbytes": nbytes + 1}, {"tick_id": -1}, {"tick_id": 2**64},
                       {"tick_id": number << 32, "nbytes": 0}):
            try:
                producer.publish(slot, **kwargs)
            except (ValueError, TypeError) as error:
                result["refused"].append(f"{type(error).__name__}: {error}")
        producer.abandon(slot)
        try:
            producer.publish(slot, number << 32)
        except ValueError as error:
            result["refused"].append(f"{type(error).__name__}: {error}")
    k = 0
    try:
        while spec["count"] < 0 or k < spec["count"]:
            try:
                slot = producer.acquire_free(timeout=spec.get("acquire_timeout", 30.0))
            except TimeoutError:  # the learner holds back: note when, and wait on (for at most 60 s)
                if result["blocked_after"] is None:
                    result["blocked_after"] = k
                    blocked_since = time.monotonic()
                if time.monotonic() - blocked_since > 60:
                    raise
                continue
            fill(producer.slot_array(slot), number << 32 | k, nbytes)
            producer.publish(slot, number << 32 | k)
            k += 1
            result["published"] = k
            if k == spec.get("mark_after", -1):
                with producer._cond:  # sends not yet complete (each slot's data and header)
                    in_flight = len(producer._in_flight)
                write_result(spec["result"] + ".mark", {"published": k, "sends_in_flight": in_flight})
    except PeerLostError as error:
        result["error"] = ["PeerLostError", str(error), time.monotonic()]
    producer.close()
    return result


def protocol_violator(spec: Dict[str, Any]) -> Dict[str, Any]:
    """Speaks the wire protocol by hand and announces more bytes than a slot holds."""
    import torch

    from tensorxfer.ipc.remote import RemoteSlotRing, protocol

    producer = RemoteSlotRing.connect(spec["init_method"], name=spec["name"], timeout=30.0)
    producer.acquire_free(timeout=10.0)
    group = producer._group
    header = torch.tensor([protocol.KIND_DATA, 0, spec["number"] << 32, producer.slot_nbytes + 4096])
    group.send([header], 0, protocol.TAG_HEADER).wait()
    deadline = time.monotonic() + 20
    while producer._lost is None and time.monotonic() < deadline:  # the learner drops us: our pair closes
        time.sleep(0.02)
    lost = producer._lost
    producer.close()
    return {"lost": lost}


def local_producer(spec: Dict[str, Any]) -> Dict[str, Any]:
    from tensorxfer.ipc import SlotRing

    ring = SlotRing.attach(spec["ring"])
    for k in range(spec["count"]):
        slot = ring.acquire_free(timeout=30.0)
        fill(ring.slot_array(slot), spec["number"] << 32 | k, spec["slot_nbytes"])
        ring.publish(slot, spec["number"] << 32 | k)
    ring.close()
    return {"published": spec["count"]}


ROLES = {"learner": learner, "remote": remote_producer, "violator": protocol_violator, "local": local_producer}

if __name__ == "__main__":
    role, spec = sys.argv[1], json.loads(sys.argv[2])
    try:
        outcome = ROLES[role](spec)
    except BaseException:  # noqa: BLE001 - reported to the test through the result file
        outcome = {"exception": traceback.format_exc()}
        write_result(spec["result"], outcome)
        sys.exit(1)
    write_result(spec["result"], outcome)
