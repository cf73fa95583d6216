"""HostStream / HostEvent / CopyEngine from Python, including the lifetime rule."""

from __future__ import annotations

import gc
import mmap
import os
import threading
import time
import weakref

import numpy as np
import pytest

from tensorxfer.runtime import CopyEngine, HostEvent, HostStream

from conftest import torch_or_skip

BIG = 64 << 20  # bytes: a copy that takes milliseconds, long enough to observe


def big_pair(nbytes: int = BIG, seed: int = 0):
    """(src, zeroed dst) of `nbytes`; src is a cheap pattern that differs per seed."""
    words = np.arange((nbytes + 3) // 4, dtype=np.uint32)
    words *= np.uint32(2654435761)
    words += np.uint32(seed * 97 + 1)
    src = words.view(np.uint8)[:nbytes]
    return src, np.zeros_like(src)


@pytest.fixture(scope="module")
def engine():
    return CopyEngine(2)


@pytest.mark.parametrize("use_engine", [False, True])
def test_enqueue_copy_then_synchronize(engine, use_engine):
    stream = HostStream(engine if use_engine else None)
    for nbytes in (0, 1, 4097, 3 << 20):
        src = np.arange(nbytes, dtype=np.uint8)
        dst = np.zeros(nbytes, np.uint8)
        stream.enqueue_copy(dst, src)
        stream.synchronize(timeout=30)
        np.testing.assert_array_equal(dst, src)
    assert stream.query()
    stream.close()


def test_copies_between_numpy_and_torch(engine):
    torch = torch_or_skip()
    stream = HostStream(engine)
    src = torch.arange(1 << 20, dtype=torch.float32)
    mid = np.zeros(1 << 20, np.float32)
    out = torch.zeros(1 << 20, dtype=torch.float32)
    stream.enqueue_copy(mid, src)
    stream.enqueue_copy(out, mid)
    stream.synchronize(timeout=30)
    assert torch.equal(out, src)
    stream.close()


def test_enqueue_returns_before_the_copy_is_done():
    """Copies queued behind another stream's 2 GiB of copies: the enqueues all return while that
    work still runs, so none of them waited for its copy. (A ratio of enqueue time to copy time
    failed under load in CI: 3.4 ms of enqueueing against 10 ms of copies.)"""
    pairs = [big_pair(seed=i) for i in range(3)]
    blocker_stream, stream, ready, _keep = _busy_stream()
    for src, dst in pairs:
        stream.enqueue_copy(dst, src)
    assert not ready.query(), "the 2 GiB blocker finished before 3 enqueues returned"
    assert stream.completed_sequence < stream.enqueued_sequence
    stream.synchronize(timeout=60)
    for src, dst in pairs:
        np.testing.assert_array_equal(dst, src)
    assert stream.completed_sequence == stream.enqueued_sequence
    blocker_stream.close()


def test_synchronize_times_out_while_work_is_pending():
    stream = HostStream(None)
    pairs = [big_pair(seed=i) for i in range(3)]
    for src, dst in pairs:
        stream.enqueue_copy(dst, src)
    with pytest.raises(TimeoutError, match=r"task\(s\) still pending after 0 s"):
        stream.synchronize(timeout=0)
    stream.synchronize(timeout=60)
    np.testing.assert_array_equal(pairs[-1][1], pairs[-1][0])


def test_stream_keeps_enqueued_tensors_alive_until_done():
    torch = torch_or_skip()
    stream = HostStream(None)
    blocker_src, blocker_dst = big_pair(4 * BIG)  # keeps the stream busy
    stream.enqueue_copy(blocker_dst, blocker_src)
    expected = np.random.default_rng(5).standard_normal(1 << 20).astype(np.float32)
    src = expected.copy()
    out = np.zeros_like(expected)
    dst = torch.from_numpy(out)  # the only owner the stream sees for dst is this tensor
    src_alive, dst_alive = weakref.ref(src), weakref.ref(dst)
    stream.enqueue_copy(dst, src)
    del src, dst
    gc.collect()
    # Owners are dropped only once the stream reports the copy done.
    assert src_alive() is not None and dst_alive() is not None
    stream.synchronize(timeout=60)
    assert src_alive() is None and dst_alive() is None
    assert stream._pending_owners == 0
    np.testing.assert_array_equal(out, expected)


def _busy_stream():
    """A stream whose next task waits behind 8 copies of 256 MiB (~0.1-1 s) on another stream: both
    streams, the other stream's event the first waits for, and the blocker's buffers."""
    blocker_stream, stream, ready = HostStream(None), HostStream(None), HostEvent()
    blocker_src, blocker_dst = big_pair(4 * BIG)
    for _ in range(8):
        blocker_stream.enqueue_copy(blocker_dst, blocker_src)
    blocker_stream.record(ready)
    stream.wait_event(ready)
    return blocker_stream, stream, ready, (blocker_src, blocker_dst)


def test_queued_copy_holds_the_buffer_export_of_its_tensors():
    blocker_stream, stream, _ready, _keep = _busy_stream()
    expected = bytes(range(256)) * 64
    src = bytearray(expected)
    dst = bytearray(len(expected))
    mapped = mmap.mmap(-1, len(expected))
    stream.enqueue_copy(dst, src)
    stream.enqueue_copy(mapped, src)
    # Until the stream has reported the copies done, their memory must not move.
    with pytest.raises(BufferError):
        src.extend(b"more")
    with pytest.raises(BufferError):
        del dst[:100]
    with pytest.raises(BufferError):
        mapped.close()
    stream.synchronize(timeout=60)
    assert bytes(dst) == expected and mapped[:] == expected
    src.extend(b"more")  # released once done
    mapped.close()
    blocker_stream.close()
    stream.close()


def test_dropping_the_last_reference_to_a_queued_buffer_is_safe():
    blocker_stream, stream, _ready, _keep = _busy_stream()
    expected = np.random.default_rng(3).integers(0, 256, 1 << 20, dtype=np.uint8).tobytes()
    dst = np.zeros(len(expected), np.uint8)
    src = bytearray(expected)
    out = bytearray(len(expected))
    stream.enqueue_copy(dst, src)
    stream.enqueue_copy(out, dst)
    del src  # the stream's export is now the only thing keeping it
    assert not stream.query(), "the copies must still be queued for this test to mean anything"
    stream.synchronize(timeout=60)
    assert dst.tobytes() == expected and bytes(out) == expected
    blocker_stream.close()
    stream.close()


def _thread_cpu_ns(tid: int) -> int:
    """CPU time of thread `tid` of this process (its CPU clock: ~tid << 3 | 6 on Linux)."""
    return time.clock_gettime_ns(((~tid) << 3) | 6)


def test_idle_engine_workers_use_no_cpu():
    before = {int(t) for t in os.listdir("/proc/self/task")}
    engine = CopyEngine()  # defaults, as pack_rows' default engine
    workers = {int(t) for t in os.listdir("/proc/self/task")} - before
    assert 1 <= len(workers) == engine.num_threads <= 7
    src, dst = big_pair(8 << 20)
    idle_ns = 0
    for _ in range(20):
        engine.copy(dst, src)
        start = sum(_thread_cpu_ns(t) for t in workers)
        time.sleep(0.01)
        idle_ns += sum(_thread_cpu_ns(t) for t in workers) - start
    np.testing.assert_array_equal(dst, src)
    # Going back to sleep costs microseconds; polling after every job costs ~200 us each.
    assert idle_ns < 20 * 20_000, f"idle workers used {idle_ns / 1e3:.0f} us of CPU in 20 gaps of 10 ms"


def test_owners_are_released_by_query_and_later_enqueues():
    stream = HostStream(None)
    src = np.ones(1024, np.uint8)
    alive = weakref.ref(src)
    stream.enqueue_copy(np.zeros(1024, np.uint8), src)
    del src
    deadline = time.monotonic() + 30
    while not stream.query():
        assert time.monotonic() < deadline
        time.sleep(0.001)
    assert alive() is None and stream._pending_owners == 0
    stream.close()


def test_event_semantics():
    stream = HostStream(None)
    event = HostEvent()
    assert event.query()  # never recorded
    event.wait()
    event.wait(timeout=0)
    pairs = [big_pair(seed=i) for i in range(2)]
    for src, dst in pairs:
        stream.enqueue_copy(dst, src)
    stream.record(event)
    with pytest.raises(TimeoutError, match="not done after"):
        event.wait(timeout=0)
    event.wait(timeout=60)
    assert event.query()
    for src, dst in pairs:  # everything before the record has run
        np.testing.assert_array_equal(dst, src)
    stream.enqueue_copy(*reversed(big_pair(seed=9)))
    stream.record(event)
    event.reset()
    assert event.query()
    stream.synchronize(timeout=60)


def test_stream_waits_for_another_streams_event(engine):
    producer, consumer = HostStream(None), HostStream(engine)
    src, mid = big_pair(2 * BIG, seed=3)
    final = np.zeros_like(src)
    ready = HostEvent()
    producer.enqueue_copy(mid, src)
    producer.record(ready)
    consumer.wait_event(ready)
    consumer.enqueue_copy(final, mid)  # without the wait this would copy zeros
    consumer.synchronize(timeout=60)
    np.testing.assert_array_equal(final, src)
    producer.close()
    consumer.close()


def test_bad_arguments_are_refused_clearly():
    stream = HostStream(None)
    with pytest.raises(ValueError, match="same number of bytes"):
        stream.enqueue_copy(np.zeros(8, np.uint8), np.zeros(9, np.uint8))
    readonly = np.zeros(8, np.uint8)
    readonly.flags.writeable = False
    with pytest.raises(ValueError, match="dst must be writable"):
        stream.enqueue_copy(readonly, np.zeros(8, np.uint8))
    with pytest.raises(ValueError, match="src must be C-contiguous"):
        stream.enqueue_copy(np.zeros(4, np.uint8), np.zeros((4, 2), np.uint8)[:, 0])
    with pytest.raises(ValueError, match="overlap"):
        buffer = np.zeros(16, np.uint8)
        stream.enqueue_copy(buffer[:8], buffer[4:12])
    with pytest.raises(TypeError):
        stream.enqueue_copy("not a tensor", np.zeros(4, np.uint8))
    with pytest.raises(ValueError, match=r"HostStream.synchronize: timeout must be None \(no deadline\) or a number of seconds >= 0, got -1"):
        stream.synchronize(timeout=-1)
    with pytest.raises(ValueError, match="HostEvent.wait: timeout must be .* got nan"):
        HostEvent().wait(timeout=float("nan"))
    with pytest.raises(TypeError, match="HostEvent.wait: timeout must be None .* got str '1'"):
        HostEvent().wait(timeout="1")
    with pytest.raises(TypeError):
        HostStream(engine="fast")  # TypeError naming the type
    assert stream.enqueued_sequence == 0


def test_close_is_idempotent_and_refuses_new_work():
    with HostStream(None) as stream:
        src, dst = big_pair(1 << 20)
        stream.enqueue_copy(dst, src)
    assert stream.closed
    np.testing.assert_array_equal(dst, src)  # close waited for pending work
    stream.close()
    with pytest.raises(ValueError, match="closed"):
        stream.enqueue_copy(dst, src)
    with pytest.raises(ValueError, match="closed"):
        stream.record(HostEvent())
    stream.synchronize(timeout=1)
    assert stream.query()


def test_dropping_a_busy_stream_finishes_its_work():
    src, dst = big_pair(2 * BIG)
    stream = HostStream(None)
    stream.enqueue_copy(dst, src)
    del stream
    gc.collect()
    np.testing.assert_array_equal(dst, src)


def test_engine_copy(engine):
    assert engine.num_threads == 2
    assert engine.max_parallelism >= 2
    assert CopyEngine().num_threads >= 1
    src, dst = big_pair(BIG + 3)
    engine.copy(dst, src)
    np.testing.assert_array_equal(dst, src)
    with pytest.raises(ValueError, match="same number of bytes"):
        engine.copy(dst[:-1], src)


def test_waits_and_copies_release_the_gil(engine):
    ticks = 0
    stop = threading.Event()

    def count():
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            time.sleep(0)

    counter = threading.Thread(target=count)
    counter.start()
    try:
        src, dst = big_pair(4 * BIG)
        before = ticks
        engine.copy(dst, src)
        during_copy = ticks - before
        stream = HostStream(None)
        stream.enqueue_copy(dst, src)
        before = ticks
        stream.synchronize(timeout=60)
        during_sync = ticks - before
    finally:
        stop.set()
        counter.join()
    # Holding the GIL would allow at most a tick or two (one switch interval).
    assert during_copy > 5 and during_sync > 5, (during_copy, during_sync)
