"""HostReplayTransferBackend specifics: asynchrony, timeouts, pre-faulting, page-locking,
buffer lifetime, and running with numpy alone."""

from __future__ import annotations

import errno
import gc
import mmap
import os
import resource
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tensorxfer import _core
from tensorxfer._tensor import as_view
from tensorxfer.ipc.replay_pipelines.transfer import HostReplayTransferBackend
from tensorxfer.ipc.replay_pipelines.transfer import _host_memory

BIG = 128 << 20  # large enough that a copy takes milliseconds on any machine


def vm_locked_kib() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmLck:"):
                return int(line.split()[1])
    pytest.skip("/proc/self/status has no VmLck")


def has_cap_ipc_lock() -> bool:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("CapEff:"):
                return bool(int(line.split()[1], 16) & (1 << 14))
    return False


@pytest.fixture
def backend():
    instance = HostReplayTransferBackend(ring_depth=2)
    yield instance
    instance.close()


def test_attributes():
    backend = HostReplayTransferBackend(device="cpu", ring_depth=1)
    assert (backend.device_family, backend.h2d_submitter, backend.host_memory_kind) == (
        "cpu", "tensorxfer_host_stream", "shared")
    assert backend.supports_async_submit is True and backend.supports_timing_events is False
    assert backend.host_pinned is False and backend.direct_pinned_shared is False and backend.pin_error is None
    backend.close()
    assert "closed" in repr(backend)


@pytest.mark.parametrize("device, error", [("cuda", ValueError), ("cuda:0", ValueError), ("cpu:x", ValueError),
                                           (0, TypeError), (None, TypeError)])
def test_only_the_host_device_is_accepted(device, error):
    with pytest.raises(error, match="device"):
        HostReplayTransferBackend(device=device, ring_depth=1)


def test_torch_cpu_device_is_accepted_and_reported():
    torch = pytest.importorskip("torch")
    with HostReplayTransferBackend(device=torch.device("cpu"), ring_depth=1) as backend:
        assert backend.device == torch.device("cpu")


def test_submit_returns_before_a_large_copy_finishes(backend):
    src = np.full(BIG, 7, np.uint8)
    dst = backend.allocate_device_slots(count=1, shape=BIG, dtype=np.uint8)[0]
    seen_pending = False
    for attempt in range(10):  # a descheduled test thread may miss the window now and then, not ten times
        src[0] = attempt
        backend.submit_h2d(slot=0, dst=dst, src=src)
        pending = not backend.ready_query(0)
        backend.synchronize_ready(0)
        assert backend.ready_query(0)
        assert dst[0] == attempt and dst[-1] == 7
        if pending:
            seen_pending = True
            break
    assert seen_pending, "ready_query was True right after every 128 MiB submit: the copy is not asynchronous"


def test_synchronize_ready_times_out_with_the_slot_named(backend):
    src = np.ones(BIG, np.uint8)
    dst = backend.allocate_device_slots(count=1, shape=BIG, dtype=np.uint8)[0]
    for _ in range(10):
        backend.submit_h2d(slot=1, dst=dst, src=src)
        try:
            backend.synchronize_ready(1, timeout=1e-5)
        except TimeoutError as error:
            assert "slot 1" in str(error)
            break
        finally:
            backend.synchronize_ready(1)
    else:
        pytest.fail("synchronize_ready(timeout=10 us) never timed out on a 128 MiB copy")


def test_wait_current_stream_blocks_the_calling_thread(backend):
    src = np.arange(BIG // 8, dtype=np.int64)
    dst = backend.allocate_device_slots(count=1, shape=src.shape, dtype=np.int64)[0]
    backend.submit_h2d(slot=0, dst=dst, src=src)
    backend.wait_current_stream_for_ready(0)
    assert backend.ready_query(0)
    assert dst[-1] == src[-1]


def test_copies_into_one_slot_run_in_submit_order(backend):
    dst = backend.allocate_device_slots(count=1, shape=1 << 20, dtype=np.int32)[0]
    sources = [np.full(1 << 20, value, np.int32) for value in range(5)]
    for source in sources:
        backend.submit_h2d(slot=0, dst=dst, src=source)
    backend.synchronize_ready(0)
    assert (dst == 4).all()


def test_caller_may_drop_tensors_right_after_submit(backend):
    expected = np.random.default_rng(0).integers(0, 255, size=BIG // 4, dtype=np.uint8)
    dst = backend.allocate_device_slots(count=1, shape=expected.shape, dtype=np.uint8)[0]
    src = expected.copy()
    backend.submit_h2d(slot=0, dst=dst, src=src)
    del src
    gc.collect()
    backend.synchronize_ready(0)
    np.testing.assert_array_equal(dst, expected)


def test_overlapping_dst_and_src_are_refused(backend):
    buffer = np.zeros(64, np.float32)
    with pytest.raises(ValueError, match="must not overlap"):
        backend.submit_h2d(slot=0, dst=buffer[8:40], src=buffer[:32])


def resident_pages(array) -> int:
    return _core.resident_page_count(as_view(array, "array"), "array")


def page_count(array) -> int:
    return _host_memory.page_range(as_view(array, "array").data_ptr, array.nbytes)[1] // mmap.PAGESIZE


def test_allocate_device_slots_prefaults_pages(backend):
    slots = backend.allocate_device_slots(count=2, shape=(16 << 20,), dtype="uint8")
    for slot in slots:
        assert isinstance(slot, np.ndarray) and not slot.any()
        assert resident_pages(slot) == page_count(slot), "device slot not pre-faulted"


def test_register_host_slots_prefaults_and_keeps_content(backend):
    # A private anonymous mapping: no page is resident before the first touch. (np.zeros'
    # calloc may reuse heap memory earlier tests touched, once glibc raised its mmap
    # threshold after they freed large arrays: then every page is resident already.)
    mapping = mmap.mmap(-1, 16 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    fresh = np.frombuffer(mapping, np.uint8)
    assert resident_pages(fresh) < page_count(fresh) // 2
    filled = np.random.default_rng(1).integers(0, 255, size=1 << 20, dtype=np.uint8)
    expected = filled.copy()
    readonly = np.ones(1 << 16, np.uint8)
    readonly.flags.writeable = False
    backend.register_host_slots([fresh, filled])
    assert resident_pages(fresh) == page_count(fresh)
    np.testing.assert_array_equal(filled, expected)
    assert not fresh.any()
    backend.register_host_slots([readonly])  # read-only slots are populated for reading
    assert resident_pages(readonly) == page_count(readonly)


def test_shared_slots_are_page_locked_until_close():
    region = mmap.mmap(-1, 4 << 20)  # MAP_SHARED | MAP_ANONYMOUS, as a shared slot ring would be
    slots = [np.frombuffer(region, np.uint8, count=2 << 20, offset=offset) for offset in (0, 2 << 20)]
    backend = HostReplayTransferBackend(ring_depth=2)
    base = vm_locked_kib()
    backend.register_host_slots(slots)
    if not backend.host_pinned:
        assert backend.pin_error and "mlock" in backend.pin_error
        pytest.skip(f"cannot page-lock 4 MiB here: {backend.pin_error}")
    assert backend.direct_pinned_shared and backend.pin_error is None
    assert vm_locked_kib() - base >= 4096
    dst = backend.allocate_device_slots(count=2, shape=2 << 20, dtype=np.uint8)
    slots[1][:] = 9
    backend.submit_h2d(slot=1, dst=dst[1], src=slots[1])
    backend.synchronize_ready(1)
    assert (dst[1] == 9).all()
    backend.register_host_slots(slots[:1])  # re-registering unlocks the old set first
    assert 2048 <= vm_locked_kib() - base < 4096
    backend.close()
    assert vm_locked_kib() == base and not backend.host_pinned
    del slots
    region.close()


def test_dropping_the_backend_unlocks_its_slots():
    slot = np.zeros(1 << 20, np.uint8)
    base = vm_locked_kib()
    backend = HostReplayTransferBackend(ring_depth=1)
    backend.register_host_slots([slot])
    pinned = backend.host_pinned
    del backend
    gc.collect()
    assert vm_locked_kib() == base
    if not pinned:
        pytest.skip("could not page-lock 1 MiB here; the unlock path was not exercised")


def test_failed_page_lock_leaves_nothing_locked(monkeypatch):
    # mlock's failure is forced for the third slot: the first two must be unlocked again.
    real_lock = _host_memory.lock
    calls = []

    def lock_failing_third(address, nbytes):
        calls.append(address)
        return errno.ENOMEM if len(calls) == 3 else real_lock(address, nbytes)

    monkeypatch.setattr(_host_memory, "lock", lock_failing_third)
    wide = HostReplayTransferBackend(ring_depth=3)
    slots = [np.zeros(1 << 20, np.uint8) for _ in range(3)]
    base = vm_locked_kib()
    wide.register_host_slots(slots)
    assert len(calls) == 3
    assert wide.host_pinned is False and wide.direct_pinned_shared is False
    assert "mlock(slots[2], 1048576 bytes) failed: ENOMEM" in wide.pin_error
    assert vm_locked_kib() == base
    wide.close()


@pytest.mark.skipif(has_cap_ipc_lock(), reason="CAP_IPC_LOCK lets mlock ignore RLIMIT_MEMLOCK")
def test_page_lock_beyond_rlimit_reports_why():
    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    resource.setrlimit(resource.RLIMIT_MEMLOCK, (0, hard))
    try:
        with HostReplayTransferBackend(ring_depth=1) as backend:
            backend.register_host_slots([np.zeros(1 << 20, np.uint8)])
            assert backend.host_pinned is False
            assert "RLIMIT_MEMLOCK" in backend.pin_error
    finally:
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (soft, hard))


def test_shared_copy_engine():
    engine = _core.CopyEngine(2)
    with HostReplayTransferBackend(ring_depth=1, copy_engine=engine) as first, \
            HostReplayTransferBackend(ring_depth=1, copy_engine=engine) as second:
        src = np.arange(1 << 18, dtype=np.float64)
        outputs = [np.zeros_like(src), np.zeros_like(src)]
        first.submit_h2d(slot=0, dst=outputs[0], src=src)
        second.submit_h2d(slot=0, dst=outputs[1], src=src * 2)
        first.synchronize_ready(0)
        second.synchronize_ready(0)
    np.testing.assert_array_equal(outputs[0], src)
    np.testing.assert_array_equal(outputs[1], src * 2)
    with pytest.raises(TypeError, match="copy_engine must be a tensorxfer._core.CopyEngine"):
        HostReplayTransferBackend(ring_depth=1, copy_engine="engine")


def test_works_with_numpy_alone_when_torch_is_absent():
    script = textwrap.dedent(
        """
        import sys
        sys.modules["torch"] = None  # any "import torch" now raises ImportError
        import numpy as np
        from tensorxfer import UnsupportedError
        from tensorxfer.ipc.replay_pipelines.transfer import (
            ReplayTransferBackend, build_replay_transfer_backend)
        with build_replay_transfer_backend(device="cpu", ring_depth=2) as backend:
            assert isinstance(backend, ReplayTransferBackend)
            assert backend.device == "cpu", backend.device
            src = np.arange(1000, dtype=np.float32)
            backend.register_host_slots([src])
            dst = backend.allocate_device_slots(count=1, shape=1000, dtype="float32")[0]
            backend.submit_h2d(slot=1, dst=dst, src=src, h2d_bytes=400)
            backend.synchronize_ready(1)
            assert (dst[:100] == src[:100]).all() and not dst[100:].any()
        try:
            build_replay_transfer_backend(device="cuda", ring_depth=2)
        except UnsupportedError as error:
            assert "needs torch, which is not installed" in str(error), error
        else:
            raise AssertionError("cuda without torch must raise")
        print("ok")
        """
    )
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                            env=environment)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
