"""SlotRing between PID namespaces (containers of one pod share /dev/shm but not
PIDs), for real with ``unshare --pid --fork``: a live peer in another namespace
is never judged dead, and a SIGKILLed one is still lost within the timeout."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

import tensorxfer
from tensorxfer import _core
from tensorxfer.ipc import SlotRing

UNSHARE = shutil.which("unshare")


def _why_no_pid_namespace() -> str:
    if UNSHARE is None:
        return "unshare(1) is not installed"
    result = subprocess.run([UNSHARE, "--pid", "--fork", "true"], capture_output=True, text=True)
    if result.returncode != 0:
        return f"unshare --pid is not allowed here (needs root/CAP_SYS_ADMIN): {result.stderr.strip()}"
    return ""


_NO_NAMESPACE = _why_no_pid_namespace()
pytestmark = [pytest.mark.multiprocess, pytest.mark.skipif(bool(_NO_NAMESPACE), reason=_NO_NAMESPACE)]

# Each prints "<pid in its namespace> <pid here> <detail>", then waits for stdin to close.
PRODUCER = """
import os, sys
from tensorxfer.ipc import SlotRing
ring = SlotRing.attach(sys.argv[1])
held = ring.acquire_free(timeout=5.0)
ring.publish(ring.acquire_free(timeout=5.0), tick_id=1)
print(os.getpid(), os.readlink("/proc/self"), held, flush=True)
sys.stdin.read()
ring.publish(held, tick_id=2)
ring.close()
"""

CONSUMER = """
import os, sys
from tensorxfer.ipc import SlotRing
ring = SlotRing.create(depth=1, slot_nbytes=64)
print(os.getpid(), os.readlink("/proc/self"), ring.name, flush=True)
sys.stdin.read()
slot, tick = ring.acquire_ready(timeout=5.0)
print(tick, flush=True)
ring.release(slot)
ring.close()
"""


class Namespaced:
    """A Python script running as pid 1 of a new PID namespace."""

    def __init__(self, script: str, *args: str) -> None:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(path for path in sys.path if path))
        self.process = subprocess.Popen(
            [UNSHARE, "--pid", "--fork", sys.executable, "-c", script, *args],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
        )
        fields = self.process.stdout.readline().split()
        assert len(fields) == 3, f"the namespaced script failed (exit {self.process.poll()})"
        self.pid_inside, self.pid_here, self.detail = int(fields[0]), int(fields[1]), fields[2]
        assert self.pid_inside == 1, "the script should be pid 1 of its own namespace"

    def finish(self) -> str:
        """Lets the script go on; returns what it printed last."""
        self.process.stdin.close()
        out = self.process.stdout.read().strip()
        assert self.process.wait(timeout=10) == 0
        return out

    def kill(self) -> None:
        os.kill(self.pid_here, signal.SIGKILL)
        self.process.wait(timeout=10)

    def __enter__(self) -> "Namespaced":
        return self

    def __exit__(self, *exc_info) -> None:
        if self.process.poll() is None:
            self.kill()
        for stream in (self.process.stdin, self.process.stdout):
            if not stream.closed:
                stream.close()


def test_a_producer_in_another_pid_namespace_stays_live():
    with SlotRing.create(depth=2, slot_nbytes=64) as consumer:
        with Namespaced(PRODUCER, consumer.name) as producer:
            held = int(producer.detail)
            slot, tick = consumer.acquire_ready(timeout=5.0)
            assert tick == 1
            consumer.release(slot)
            # Its pid (1) means nothing here; it is still alive to the ring, and the
            # slot it holds for writing is not reaped.
            with pytest.raises(TimeoutError):
                consumer.acquire_ready(timeout=0.2)
            assert consumer.live_producers == 1
            producer.finish()
            assert consumer.acquire_ready(timeout=5.0) == (held, 2)


def test_a_killed_producer_in_another_pid_namespace_is_lost_within_the_timeout():
    with SlotRing.create(depth=2, slot_nbytes=64) as consumer:
        with Namespaced(PRODUCER, consumer.name) as producer:
            consumer.release(consumer.acquire_ready(timeout=5.0)[0])
            producer.kill()
            start = time.monotonic()
            with pytest.raises(tensorxfer.PeerLostError):
                consumer.acquire_ready(timeout=5.0)
            assert time.monotonic() - start < 1.0
            assert consumer.live_producers == 0


def test_a_consumer_in_another_pid_namespace_keeps_its_ring():
    with Namespaced(CONSUMER) as consumer:
        name = consumer.detail
        assert name.startswith("/tensorxfer-1-")
        with SlotRing.attach(name) as producer:
            slot = producer.acquire_free(timeout=5.0)
            with pytest.raises(TimeoutError):
                producer.acquire_free(timeout=0.2)  # waits for a live consumer
            _core.sweep_stale_segments()
            assert os.path.exists("/dev/shm" + name), "a live consumer's ring was removed"
            producer.publish(slot, tick_id=5)
            assert consumer.finish() == "5"
    assert not os.path.exists("/dev/shm" + name)


def test_a_killed_consumer_in_another_pid_namespace_is_lost_within_the_timeout():
    with Namespaced(CONSUMER) as consumer:
        name = consumer.detail
        with SlotRing.attach(name) as producer:
            producer.acquire_free(timeout=5.0)
            consumer.kill()
            start = time.monotonic()
            with pytest.raises(tensorxfer.PeerLostError):
                producer.acquire_free(timeout=5.0)
            assert time.monotonic() - start < 1.0
    assert not os.path.exists("/dev/shm" + name)
