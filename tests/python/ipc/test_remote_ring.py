"""Remote producers in one process (the learner's relay and a producer on threads, gloo over
loopback): the calls, their argument checks, and report_peer_lost.  The cross-host cases, with
faults, are in test_remote_ring_hosts.py."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from conftest import torch_or_skip
from tensorxfer.errors import ClosedError, PeerLostError
from tensorxfer.ipc import SlotRing

torch_or_skip()

from tensorxfer.ipc.remote import RemoteProducers, RemoteSlotRing  # noqa: E402
from tensorxfer.ipc.remote.rendezvous import parse_init_method  # noqa: E402


def test_report_peer_lost_is_raised_once_by_the_next_acquire_ready():
    with SlotRing.create(2, 64) as ring:
        producer = SlotRing.attach(ring.handle)
        slot = producer.acquire_free(timeout=1.0)
        producer.publish(slot, 5)
        ring.report_peer_lost("remote producer 'x' lost")
        with pytest.raises(PeerLostError, match="'x'"):
            ring.acquire_ready(timeout=1.0)
        assert ring.acquire_ready(timeout=1.0) == (slot, 5)
        with pytest.raises(ValueError, match="only the ring's creator"):
            producer.report_peer_lost("y")
        with pytest.raises(TypeError):
            ring.report_peer_lost(3)  # type: ignore[arg-type]
        producer.close()


def test_init_method_names_follow_torch(monkeypatch):
    assert parse_init_method("tcp://10.1.2.3:29500") == ("10.1.2.3", 29500)
    monkeypatch.setenv("MASTER_ADDR", "learner-host")
    monkeypatch.setenv("MASTER_PORT", "29400")
    assert parse_init_method(None) == parse_init_method("env://") == ("learner-host", 29400)
    monkeypatch.delenv("MASTER_PORT")
    with pytest.raises(ValueError, match="MASTER_PORT is not set"):
        parse_init_method("env://")
    for bad in ("file:///tmp/x", "tcp://nohost", "tcp://h:99999", 7):
        with pytest.raises(ValueError, match="init_method|port"):
            parse_init_method(bad)  # type: ignore[arg-type]


def test_serve_checks_its_arguments():
    with SlotRing.create(4, 64) as ring:
        for credits in (0, 5):
            with pytest.raises(ValueError, match=r"credits \(at most the ring's depth\): expected an integer in \[1, 4\]"):
                RemoteProducers.serve(ring, "tcp://127.0.0.1:0", credits=credits)
        for credits in (True, 1.0):
            with pytest.raises(TypeError, match="credits"):
                RemoteProducers.serve(ring, "tcp://127.0.0.1:0", credits=credits)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="timeout"):
            RemoteProducers.serve(ring, "tcp://127.0.0.1:0", timeout=0)
        producer = SlotRing.attach(ring.handle)
        with pytest.raises(ValueError, match="consumer"):
            RemoteProducers.serve(producer, "tcp://127.0.0.1:0")
        producer.close()


def test_a_producer_on_a_thread_feeds_the_ring_and_hears_the_close():
    slot_nbytes = 4096
    with SlotRing.create(4, slot_nbytes) as ring:
        remote = RemoteProducers.serve(ring, "tcp://127.0.0.1:0", credits=2, timeout=10.0)
        connected: list = []
        thread = threading.Thread(target=lambda: connected.append(
            RemoteSlotRing.connect(remote.init_method, name="thread-producer", timeout=30.0)))
        thread.start()
        thread.join(60)
        [producer] = connected
        try:
            assert (producer.depth, producer.slot_nbytes, producer.name) == (2, slot_nbytes, "thread-producer")
            slot = producer.acquire_free(timeout=10.0)
            with pytest.raises(ValueError, match=f"a slot holds {slot_nbytes} bytes"):
                producer.publish(slot, 1, nbytes=slot_nbytes + 1)
            for tick_id in (-1, 2**64):
                with pytest.raises(ValueError, match="tick_id"):
                    producer.publish(slot, tick_id)
            with pytest.raises(TypeError, match="tick_id"):
                producer.publish(slot, 1.5)  # type: ignore[arg-type]
            producer.slot_array(slot)[:] = 7
            producer.publish(slot, 2**64 - 1, nbytes=100)  # the largest tick id survives the int64 wire
            with pytest.raises(ValueError, match="not held"):
                producer.publish(slot, 3)
            with producer.writing(tick_id=8, timeout=10.0) as second:
                producer.slot_array(second)[:] = 8
            got = []
            for _ in range(2):
                ready, tick_id = ring.acquire_ready(timeout=10.0)
                got.append((tick_id, int(ring.slot_array(ready)[0]), int(ring.slot_array(ready)[99])))
                ring.release(ready)
            assert got == [(2**64 - 1, 7, 7), (8, 8, 8)]
            # The relay (a process of its own) reports its counts just after it publishes.
            expected = [("thread-producer", "active", 2, 100 + slot_nbytes)]
            deadline = time.monotonic() + 10
            while [(stats.name, stats.state, stats.slots, stats.bytes) for stats in remote.stats] != expected:
                assert time.monotonic() < deadline, remote.stats
                time.sleep(0.01)
            remote.close()
            deadline = time.monotonic() + 10
            with pytest.raises(PeerLostError, match="closed its ring"):
                while time.monotonic() < deadline:  # the credits still held are spent first
                    with producer.writing(tick_id=9, timeout=1.0) as third:
                        producer.slot_array(third)[:] = 9
            assert isinstance(producer.slot_array(0), np.ndarray)
        finally:
            producer.close()
            remote.close()
        with pytest.raises(ClosedError):
            producer.acquire_free(timeout=0)
