"""CUDA/ROCm backend: which submitter issues the copy (given the build), the native
submitter's binding, and the device tests (skipped without a device, with the reason)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from cuda_availability import fail_if_the_core_misses_torchs_gpu
from replay_backend_helpers import RecordingTraceRecorder

from tensorxfer import UnsupportedError, _core
from tensorxfer.ipc.replay_pipelines.base import ReplayTickMetadata
from tensorxfer.ipc.replay_pipelines.transfer import CudaLikeReplayTransferBackend
from tensorxfer.ipc.replay_pipelines.transfer import _common
from tensorxfer.ipc.replay_pipelines.transfer.cuda_like import native_submitter_compiled, select_h2d_submitter

torch = pytest.importorskip("torch", reason="torch is not installed (pip install .[torch])")
fail_if_the_core_misses_torchs_gpu(torch)
NO_CUDA = "no CUDA device: torch.cuda.is_available() is False"
BUILT_WITH_CUDA = _core.cuda_status()["compiled"]


def test_class_attributes():
    assert CudaLikeReplayTransferBackend.supports_async_submit is True
    assert CudaLikeReplayTransferBackend.supports_timing_events is True
    assert CudaLikeReplayTransferBackend.host_memory_kind == "pinned_shared"


# ---- which submitter -------------------------------------------------------------------------
@pytest.mark.parametrize(
    "native_compiled, hip, expected",
    [(True, False, "pybind11"), (False, False, "torch_copy_stream"),
     (True, True, "torch_copy_stream"), (False, True, "torch_copy_stream")],
)
def test_submitter_follows_the_build_and_rocm_always_uses_torch(native_compiled, hip, expected):
    assert select_h2d_submitter(native_compiled=native_compiled, hip=hip) == expected


def test_the_native_submitter_is_compiled_exactly_when_the_extension_has_cuda():
    assert _core.cuda_copy_compiled is BUILT_WITH_CUDA
    assert native_submitter_compiled() is BUILT_WITH_CUDA
    assert hasattr(_core, "CudaCopySubmitter") is BUILT_WITH_CUDA


@pytest.mark.skipif(not BUILT_WITH_CUDA, reason="this extension was built without CUDA: no native submitter")
@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present: covered by TestOnDevice")
def test_native_submitter_without_a_device_says_why():
    with pytest.raises(UnsupportedError, match=r"CudaCopySubmitter: cudaGetDeviceCount failed: .*\(cuda\w+\)"):
        _core.CudaCopySubmitter(0)


@pytest.mark.skipif(not BUILT_WITH_CUDA, reason="this extension was built without CUDA: no native submitter")
def test_native_submitter_refuses_a_negative_device_before_calling_cuda():
    before = _core.cuda_runtime_calls()
    with pytest.raises(ValueError, match=r"device must be a GPU id >= 0, got -1"):
        _core.CudaCopySubmitter(-1)
    assert _core.cuda_runtime_calls() == before


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present")
def test_construction_without_a_device_says_what_is_missing():
    with pytest.raises(UnsupportedError, match=r"device 'cuda' requested but torch.cuda.is_available\(\) is False"):
        CudaLikeReplayTransferBackend(device="cuda", ring_depth=2)


def test_a_non_cuda_device_is_refused():
    with pytest.raises(ValueError, match=r"needs a 'cuda' device, got 'cpu'"):
        CudaLikeReplayTransferBackend(device="cpu", ring_depth=2)


# ---- the blocking wait the device backends use -----------------------------------------------
@pytest.fixture
def no_sleeping(monkeypatch):
    def forbidden(_seconds):
        raise AssertionError("a device wait must block, not sleep-poll")

    monkeypatch.setattr(time, "sleep", forbidden)


def test_wait_blocking_returns_when_the_blocking_wait_does(no_sleeping):
    gate = threading.Event()
    threading.Timer(0.1, gate.set).start()
    start = time.monotonic()
    _common.wait_blocking(lambda: gate.wait(10), 5.0, "the gate")
    assert gate.is_set() and 0.05 < time.monotonic() - start < 5


def test_wait_blocking_times_out_naming_what(no_sleeping):
    gate = threading.Event()
    try:
        with pytest.raises(TimeoutError, match=r"the copy into slot 3 did not finish within 0.1 s"):
            _common.wait_blocking(lambda: gate.wait(10), 0.1, "the copy into slot 3")
    finally:
        gate.set()  # lets the abandoned helper thread end


def test_wait_blocking_re_raises_the_waits_error_and_skips_finished_work():
    def failing_wait():
        raise RuntimeError("device lost")

    with pytest.raises(RuntimeError, match="device lost"):
        _common.wait_blocking(failing_wait, 5.0, "x")
    calls = []
    _common.wait_blocking(lambda: calls.append("waited"), 5.0, "x", done=lambda: True)
    assert calls == []


# ---- on a device -----------------------------------------------------------------------------
@pytest.fixture
def backend():
    instance = CudaLikeReplayTransferBackend(device="cuda", ring_depth=2)
    yield instance
    instance.close()


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA)
class TestOnDevice:
    def test_family_submitter_and_resolved_index(self, backend):
        assert backend.device_family == ("rocm" if torch.version.hip else "cuda")
        expected = select_h2d_submitter(native_compiled=native_submitter_compiled(), hip=bool(torch.version.hip))
        if backend.native_submitter_error is None:
            assert backend.h2d_submitter == expected
        else:  # the extension's CUDA runtime could not start on this driver
            assert expected == "pybind11" and backend.h2d_submitter == "torch_copy_stream"
        assert backend.device.index == torch.cuda.current_device()

    def test_the_native_submitter_issues_the_copy(self, backend):
        if backend.h2d_submitter != "pybind11":
            pytest.skip(f"h2d_submitter is {backend.h2d_submitter!r} here: "
                        f"{backend.native_submitter_error or 'ROCm, or an extension built without CUDA'}")
        src = torch.arange(1 << 20, dtype=torch.int32)
        dst = backend.allocate_device_slots(count=1, shape=src.shape, dtype=torch.int32)[0]
        before = _core.cuda_runtime_calls()
        backend.submit_h2d(slot=0, dst=dst, src=src)
        assert _core.cuda_runtime_calls() > before, "the copy did not go through the core's cudaMemcpyAsync"
        backend.synchronize_ready(0)
        assert torch.equal(dst.cpu(), src)

    def test_register_pins_in_place_and_close_unpins(self):
        slots = [torch.zeros(1 << 20, dtype=torch.uint8) for _ in range(2)]
        backend = CudaLikeReplayTransferBackend(device="cuda", ring_depth=2)
        backend.register_host_slots(slots)
        assert backend.host_pinned and backend.direct_pinned_shared, backend.pin_error
        assert all(slot.is_pinned() for slot in slots)
        backend.close()
        assert not backend.host_pinned
        assert not any(slot.is_pinned() for slot in slots)

    def test_async_copy_then_current_stream_waits(self, backend):
        src = torch.arange(1 << 22, dtype=torch.float32)
        backend.register_host_slots([src])
        dst = backend.allocate_device_slots(count=1, shape=src.shape, dtype=torch.float32)[0]
        backend.submit_h2d(slot=0, dst=dst, src=src)
        backend.wait_current_stream_for_ready(0)
        copied = dst.clone()  # queued on the current stream behind the event
        # The tensors, not float32 sums: a GPU and a CPU reduce in different orders.
        assert torch.equal(copied.cpu(), src)
        assert backend.ready_query(0)

    def test_the_copy_waits_for_work_queued_on_the_callers_stream(self, backend):
        src = torch.ones(1 << 24, dtype=torch.uint8)
        backend.register_host_slots([src])
        dst = backend.allocate_device_slots(count=1, shape=src.shape, dtype=torch.uint8)[0]
        torch.cuda._sleep(200_000_000)  # keeps the current stream busy for a while
        dst.fill_(7)  # the previous step's last use of dst, queued on the current stream
        backend.submit_h2d(slot=0, dst=dst, src=src)
        backend.synchronize_ready(0)
        torch.cuda.synchronize()
        assert bool((dst == 1).all()), "the copy ran before the caller's stream was done with dst"

    def test_synchronize_ready_blocks_without_sleep_polling(self, backend, no_sleeping):
        # A registered (pinned) slot: a copy from pageable memory returns only once it is done.
        src = torch.ones(1 << 24, dtype=torch.uint8)
        backend.register_host_slots([src])
        dst = backend.allocate_device_slots(count=1, shape=src.shape, dtype=torch.uint8)[0]
        torch.cuda._sleep(200_000_000)
        backend.submit_h2d(slot=1, dst=dst, src=src)
        assert not backend.ready_query(1)
        backend.synchronize_ready(1, timeout=60)
        assert backend.ready_query(1) and bool((dst == 1).all())

    def test_trace_args_carry_the_seven_fields_and_the_backend_facts(self, backend):
        recorder = RecordingTraceRecorder()
        src = torch.ones(1 << 16, dtype=torch.uint8)
        backend.register_host_slots([src])
        dst = backend.allocate_device_slots(count=1, shape=src.shape, dtype=torch.uint8)[0]
        metadata = ReplayTickMetadata(tick_id=1, snapshot_ptr=src.data_ptr(), snapshot_size=src.numel(),
                                      sample_seed=5, sample_count=16, batch_host_slot=0, batch_gpu_slot=0)
        backend.submit_h2d(slot=0, dst=dst, src=src, metadata=metadata, trace_recorder=recorder,
                           pack_layout="flat", pack_executor="native")
        backend.synchronize_ready(0)
        args = recorder.slices[0][4]
        assert {key: args[key] for key in metadata.trace_args()} == metadata.trace_args()
        assert args["h2d_submitter"] == backend.h2d_submitter
        assert args["pinned_memory"] is True and args["direct_pinned_shared"] is True
        assert (args["slot"], args["h2d_bytes"], args["pack_layout"], args["pack_executor"]) == (
            0, src.numel(), "flat", "native")

    def test_timing_events_resolve(self, backend):
        recorder = RecordingTraceRecorder()
        src = np.ones(1 << 20, np.float32)
        dst = backend.allocate_device_slots(count=1, shape=src.shape, dtype=np.float32)[0]
        backend.submit_h2d(slot=1, dst=dst, src=src, trace_recorder=recorder, trace_cuda_events=True)
        backend.synchronize_ready(1)
        (name, _category, _begin, start, end, args), = recorder.pending_spans
        end.synchronize()
        assert name == "replay.h2d_copy" and args["h2d_bytes"] == src.nbytes
        assert start.elapsed_time(end) > 0.0
