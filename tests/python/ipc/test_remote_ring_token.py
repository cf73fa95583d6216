"""The optional shared secret of remote producers, on loopback: with a token only producers that
answer the learner's HMAC challenge are admitted, and a producer given a token refuses a learner
that cannot prove it holds the same one (SECURITY.md beside tensorxfer/ipc/remote)."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, List

import numpy as np
import pytest

from conftest import torch_or_skip
from tensorxfer.ipc import SlotRing

torch_or_skip()

from tensorxfer.ipc.remote import RemoteProducers, RemoteSlotRing  # noqa: E402
from tensorxfer.ipc.remote.handshake import TOKEN_ENVIRONMENT, resolve_token  # noqa: E402

pytestmark = pytest.mark.timeout(120)

TOKEN = "a shared secret of enough bytes"


def connect(remote: RemoteProducers, **kwargs: Any) -> RemoteSlotRing:
    return RemoteSlotRing.connect(remote.init_method, name=kwargs.pop("name", "p"), timeout=20.0, **kwargs)


def deliver_one(ring: SlotRing, producer: RemoteSlotRing, tick_id: int) -> None:
    slot = producer.acquire_free(timeout=10.0)
    producer.slot_array(slot)[:] = tick_id % 251
    producer.publish(slot, tick_id)
    got, tick = ring.acquire_ready(timeout=10.0)
    assert tick == tick_id and np.all(ring.slot_array(got) == tick_id % 251)
    ring.release(got)


def test_only_producers_with_the_token_are_admitted(caplog):
    caplog.set_level(logging.WARNING, logger="tensorxfer.ipc.remote")
    with SlotRing.create(4, 256) as ring:
        remote = RemoteProducers.serve(ring, "tcp://127.0.0.1:0", timeout=2.0, token=TOKEN)
        try:
            with connect(remote, name="holder", token=TOKEN.encode()) as producer:
                deliver_one(ring, producer, 11)
            with pytest.raises(PermissionError, match="admits only producers with its token"):
                connect(remote, name="without")
            with pytest.raises(PermissionError, match="refused this producer: answered the token challenge wrongly"):
                connect(remote, name="other", token="another secret of enough bytes")
            deadline = time.monotonic() + 10  # the learner waits its timeout for an answer that never comes
            while len(remote.refusals) < 2:
                assert time.monotonic() < deadline, remote.refusals
                time.sleep(0.02)
            reasons = [stats.reason for stats in remote.refusals]
            assert any("answered no token challenge within 2 s" in reason for reason in reasons), reasons
            assert any("answered the token challenge wrongly" in reason for reason in reasons), reasons
            assert sum("refused remote producer 'other'" in record.getMessage() for record in caplog.records) == 1
            assert [stats.name for stats in remote.stats] == ["holder"]
            with connect(remote, name="holder-again", token=TOKEN) as producer:  # refusals changed nothing
                deliver_one(ring, producer, 12)
        finally:
            remote.close()


@pytest.mark.slow
def test_a_producer_with_a_token_refuses_a_learner_without_one():
    with SlotRing.create(4, 256) as ring:
        remote = RemoteProducers.serve(ring, "tcp://127.0.0.1:0", timeout=2.0)
        try:
            with pytest.raises(PermissionError, match="did not prove it holds the token"):
                connect(remote, token=TOKEN)
            with connect(remote, name="plain") as producer:  # without a token on either side: admitted
                deliver_one(ring, producer, 5)
        finally:
            remote.close()


def test_the_token_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv(TOKEN_ENVIRONMENT, TOKEN)
    assert resolve_token(None) == TOKEN.encode()
    with SlotRing.create(4, 256) as ring:
        remote = RemoteProducers.serve(ring, "tcp://127.0.0.1:0", timeout=2.0)
        try:
            with connect(remote) as producer:
                deliver_one(ring, producer, 3)
            monkeypatch.delenv(TOKEN_ENVIRONMENT)
            with pytest.raises(PermissionError, match="admits only producers with its token"):
                connect(remote)
        finally:
            remote.close()


def test_token_arguments_are_checked():
    with pytest.raises(ValueError, match="at least 16 bytes"):
        resolve_token("short")
    with pytest.raises(TypeError, match="str or bytes"):
        resolve_token(12345678901234567890)  # type: ignore[arg-type]
    with SlotRing.create(2, 64) as ring:
        with pytest.raises(ValueError, match="at least 16 bytes"):
            RemoteProducers.serve(ring, "tcp://127.0.0.1:0", token="short")


@pytest.mark.slow
def test_concurrent_joins_with_the_token_each_prove_their_own_session():
    """Several producers joining at once: each answer is bound to its session and challenge."""
    with SlotRing.create(8, 256) as ring:
        remote = RemoteProducers.serve(ring, "tcp://127.0.0.1:0", credits=1, timeout=5.0, token=TOKEN)
        producers: List[RemoteSlotRing] = []
        errors: List[BaseException] = []
        lock = threading.Lock()

        def join(number: int) -> None:
            try:
                producer = connect(remote, name=f"p{number}", token=TOKEN)
                with lock:
                    producers.append(producer)
            except BaseException as error:  # noqa: BLE001 - the test reads it
                errors.append(error)

        threads = [threading.Thread(target=join, args=(number,)) for number in range(4)]
        try:
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(60)
            assert errors == [] and len(producers) == 4
            assert sorted(stats.name for stats in remote.stats) == ["p0", "p1", "p2", "p3"]
        finally:
            for producer in producers:
                producer.close()
            remote.close()
