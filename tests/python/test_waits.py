"""Every wait in the package: one meaning of ``timeout`` (None: no deadline, 0: try
once, negative/NaN: ValueError, non-numbers: TypeError), and Ctrl-C ends it within
100 ms with KeyboardInterrupt, also with ``timeout=None``, leaving it usable."""

from __future__ import annotations

import _thread
import math
import multiprocessing
import os
import signal
import threading
import time
from typing import Any, Callable, Dict, Tuple

import numpy as np
import pytest

from tensorxfer.ipc import SlotRing
from tensorxfer.ipc.replay_pipelines.transfer import HostReplayTransferBackend
from tensorxfer.runtime import HostEvent, HostStream, LocalGroup

# ---- timeout rules ------------------------------------------------------------------------


def _ring_waits() -> Tuple[Dict[str, Callable[..., Any]], Callable[[], None]]:
    """acquire_ready on an empty ring and acquire_free on a full one: neither can succeed."""
    ring = SlotRing.create(depth=1, slot_nbytes=64)
    producer = SlotRing.attach(ring.handle)
    producer.acquire_free(timeout=1.0)

    def close() -> None:
        producer.close()
        ring.close()

    waits = {"SlotRing.acquire_ready": ring.acquire_ready, "SlotRing.acquire_free": producer.acquire_free}
    return waits, close


def _idle_waits() -> Tuple[Dict[str, Callable[..., Any]], Callable[[], None]]:
    """Waits with nothing to wait for: each returns at once."""
    stream = HostStream()
    event = HostEvent()
    stream.record(event)
    stream.synchronize(timeout=10.0)
    backend = HostReplayTransferBackend(ring_depth=1)

    def close() -> None:
        stream.close()
        backend.close()

    waits = {
        "HostStream.synchronize": stream.synchronize,
        "HostEvent.wait": event.wait,
        "HostReplayTransferBackend.synchronize_ready": lambda timeout: backend.synchronize_ready(0, timeout=timeout),
        "HostReplayTransferBackend.wait_current_stream_for_ready":
            lambda timeout: backend.wait_current_stream_for_ready(0, timeout=timeout),
    }
    return waits, close


@pytest.mark.parametrize("bad, error, shown", [(-1, ValueError, "got -1"), (-0.5, ValueError, "got -0.5"),
                                               (math.nan, ValueError, "got nan"), (-math.inf, ValueError, "got -inf"),
                                               ("1", TypeError, "got str '1'"), (True, TypeError, "got bool True"),
                                               (1j, TypeError, "got complex")])
def test_bad_timeouts_are_refused_the_same_way_by_every_wait(bad, error, shown):
    for make in (_ring_waits, _idle_waits):
        waits, close = make()
        try:
            for operation, wait in waits.items():
                with pytest.raises(error, match=rf"{operation}: timeout must be None \(no deadline\) or .*{shown}"):
                    wait(bad)
        finally:
            close()


@pytest.mark.parametrize("timeout", [None, 0, 0.0, 2, np.float64(2.5), math.inf])
def test_every_wait_accepts_none_zero_and_seconds(timeout):
    waits, close = _idle_waits()
    try:
        for wait in waits.values():
            wait(timeout)  # nothing pending: returns at once, whatever the timeout
    finally:
        close()


def test_zero_means_try_once():
    waits, close = _ring_waits()
    try:
        for operation, wait in waits.items():
            start = time.monotonic()
            with pytest.raises(TimeoutError):
                wait(0)
            assert time.monotonic() - start < 0.5, operation
    finally:
        close()


def test_none_waits_past_any_default_until_the_work_is_done():
    # HostStream and the replay backends once turned None into a fixed default; None is "no deadline".
    backend = HostReplayTransferBackend(ring_depth=1)
    try:
        src = np.ones(1 << 20, np.uint8)
        dst = np.zeros_like(src)
        backend.submit_h2d(slot=0, dst=dst, src=src)
        backend.synchronize_ready(0, timeout=None)
        assert backend.ready_query(0)
        assert np.array_equal(dst, src)
    finally:
        backend.close()


# ---- Ctrl-C, in this process (a thread interrupts the main thread) ---------------------------


def _interrupt_main_after(delay_s: float) -> threading.Thread:
    def fire() -> None:
        time.sleep(delay_s)
        _thread.interrupt_main(signal.SIGINT)  # as a real SIGINT: the handler runs at the next check

    thread = threading.Thread(target=fire, daemon=True)
    thread.start()
    return thread


def test_ctrl_c_ends_acquire_ready_and_the_ring_stays_usable():
    with SlotRing.create(depth=2, slot_nbytes=64) as ring, SlotRing.attach(ring.handle) as producer:
        with pytest.raises(KeyboardInterrupt):
            thread = _interrupt_main_after(0.05)
            ring.acquire_ready(timeout=None)
        thread.join()
        assert ring.try_acquire_ready() is None  # nothing was taken or invented
        slot = producer.acquire_free(timeout=1.0)
        producer.publish(slot, tick_id=5)
        assert ring.acquire_ready(timeout=None) == (slot, 5)
        ring.release(slot)


def test_ctrl_c_ends_acquire_free_and_no_slot_is_lost():
    with SlotRing.create(depth=1, slot_nbytes=64) as ring, SlotRing.attach(ring.handle) as producer:
        held = producer.acquire_free(timeout=1.0)
        producer.publish(held, tick_id=1)
        with pytest.raises(KeyboardInterrupt):
            thread = _interrupt_main_after(0.05)
            producer.acquire_free(timeout=None)
        thread.join()
        slot, _ = ring.acquire_ready(timeout=1.0)
        ring.release(slot)
        assert producer.acquire_free(timeout=None) == held  # the one slot came back, not leaked


def test_a_wait_without_deadline_on_another_thread_ends_on_publish():
    # Off the main thread the signal check is empty (Python handles signals on the main thread only).
    with SlotRing.create(depth=2, slot_nbytes=64) as ring, SlotRing.attach(ring.handle) as producer:
        results = []
        waiter = threading.Thread(target=lambda: results.append(ring.acquire_ready(timeout=None)))
        waiter.start()
        time.sleep(0.1)
        slot = producer.acquire_free(timeout=1.0)
        producer.publish(slot, tick_id=9)
        waiter.join(10.0)
        assert results == [(slot, 9)]
        ring.release(slot)


# ---- Ctrl-C, a real SIGINT to a spawned child stuck in a wait -------------------------------

WAIT_KINDS = ["SlotRing.acquire_ready", "SlotRing.acquire_free", "HostStream.synchronize", "HostEvent.wait"]
_COPY_NBYTES = 16 << 20
_BUSY_SECONDS = 4.0


def _busy_stream() -> Tuple[HostStream, Any]:
    """A stream with about _BUSY_SECONDS of copies queued (there is no task that blocks forever)."""
    stream = HostStream()
    src = np.ones(_COPY_NBYTES, np.uint8)
    dst = np.empty_like(src)
    stream.enqueue_copy(dst, src)  # first touch of dst's pages, not timed: it would inflate the estimate
    stream.synchronize(timeout=30.0)
    start = time.monotonic()
    for _ in range(4):
        stream.enqueue_copy(dst, src)
    stream.synchronize(timeout=30.0)
    per_copy = max((time.monotonic() - start) / 4, 1e-4)
    # Four times the estimate: a loaded machine may have timed the copies slower than they then run
    # (the queue is cancelled at close, so the surplus costs nothing).
    for _ in range(min(int(4 * _BUSY_SECONDS / per_copy) + 1, 100_000)):
        stream.enqueue_copy(dst, src)
    return stream, (src, dst)


def wait_until_interrupted(kind: str, connection) -> None:
    """Child: starts a wait that cannot end with timeout=None, reports how Ctrl-C ended it."""
    cleanup = []
    if kind.startswith("SlotRing"):
        ring = SlotRing.create(depth=1, slot_nbytes=64)
        producer = SlotRing.attach(ring.handle)
        cleanup += [producer.close, ring.close]
        if kind == "SlotRing.acquire_free":
            producer.acquire_free(timeout=1.0)  # the only slot: the next acquire_free waits
            wait, unchanged = (lambda: producer.acquire_free(timeout=None)), (lambda: producer.try_acquire_free() is None)
        else:
            wait, unchanged = (lambda: ring.acquire_ready(timeout=None)), (lambda: ring.try_acquire_ready() is None)
    else:
        stream, buffers = _busy_stream()
        cleanup.append(lambda: _close_cancelling(stream))
        if kind == "HostEvent.wait":
            event = HostEvent()
            stream.record(event)
            wait, unchanged = (lambda: event.wait(timeout=None)), (lambda: not event.query())
        else:
            wait, unchanged = (lambda: stream.synchronize(timeout=None)), (lambda: not stream.query())
    connection.send(("waiting", time.monotonic()))
    try:
        wait()
        connection.send(("returned", time.monotonic(), False))
    except KeyboardInterrupt:
        interrupted_at = time.monotonic()
        connection.send(("interrupted", interrupted_at, unchanged()))
    finally:
        for close in cleanup:
            close()


def _close_cancelling(stream: HostStream) -> None:
    try:
        stream.close(timeout=0)  # cancel the queued copies instead of running them all
    except TimeoutError:
        pass


@pytest.mark.multiprocess
@pytest.mark.parametrize("kind", WAIT_KINDS)
def test_sigint_ends_a_wait_without_timeout_within_100_ms(kind):
    context = multiprocessing.get_context("spawn")
    receiver, sender = context.Pipe(duplex=False)
    child = context.Process(target=wait_until_interrupted, args=(kind, sender), daemon=True)
    child.start()
    try:
        assert receiver.poll(60.0), "the child did not start its wait"  # start-up is not measured
        message = receiver.recv()
        assert message[0] == "waiting", message
        time.sleep(0.3)  # well inside the wait (past its spin, asleep)
        signalled_at = time.monotonic()
        os.kill(child.pid, signal.SIGINT)
        assert receiver.poll(10.0), f"{kind}: SIGINT did not end the wait"
        outcome, ended_at, unchanged = receiver.recv()
        assert outcome == "interrupted", f"{kind}: the wait {outcome} instead of raising KeyboardInterrupt"
        latency = ended_at - signalled_at
        print(f"{kind}: KeyboardInterrupt {latency * 1000:.1f} ms after SIGINT")
        assert 0 <= latency < 0.1, f"{kind}: KeyboardInterrupt came {latency * 1000:.1f} ms after SIGINT"
        assert signalled_at - message[1] >= 0.25  # the signal came during the wait, not before it
        assert unchanged, f"{kind}: the interrupted wait changed what it waited on"
        child.join(30.0)
        assert child.exitcode == 0
    finally:
        if child.is_alive():
            child.kill()
            child.join(10.0)


# ---- a child fork()ed from another thread: its waits still take Ctrl-C ----------------------


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded, use of fork:DeprecationWarning")
def test_sigint_ends_a_wait_in_a_child_forked_from_another_thread():
    # The bindings remember Python's main thread; in a child fork()ed from another
    # thread that thread becomes the main one, so what was remembered must be forgotten.
    ring = SlotRing.create(depth=1, slot_nbytes=64)
    with pytest.raises(TimeoutError):
        ring.acquire_ready(timeout=0)  # a wait on this main thread: remembered here
    forked: Dict[str, int] = {}

    def fork_here() -> None:
        pid = os.fork()
        if pid == 0:
            code = 3
            try:  # a group of two that nobody else joins
                LocalGroup.join(f"forked-{os.getpid()}", rank=0, world_size=2, timeout=None)
            except KeyboardInterrupt:
                code = 7
            except BaseException as error:  # noqa: BLE001 (reported, then exit code 3)
                os.write(2, f"child: {error!r}\n".encode())
            finally:
                os._exit(code)
        forked["pid"] = pid

    thread = threading.Thread(target=fork_here)
    thread.start()
    thread.join()
    pid = forked["pid"]
    try:
        time.sleep(0.5)
        os.kill(pid, signal.SIGINT)
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.02)
        else:
            raise AssertionError("SIGINT did not end the forked child's wait within 10 s")
        assert os.waitstatus_to_exitcode(status) == 7
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
        ring.close()
