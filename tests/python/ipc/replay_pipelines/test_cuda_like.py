"""CUDA/ROCm backend: device tests skip without a device; the no-device error is tested here."""

from __future__ import annotations

import numpy as np
import pytest
from replay_backend_helpers import RecordingTraceRecorder

from tensorxfer import UnsupportedError
from tensorxfer.ipc.replay_pipelines.transfer import CudaLikeReplayTransferBackend

torch = pytest.importorskip("torch", reason="torch is not installed (pip install .[torch])")
NO_CUDA = "no CUDA device: torch.cuda.is_available() is False"


def test_class_attributes():
    assert CudaLikeReplayTransferBackend.h2d_submitter == "torch_cuda_copy_stream"
    assert CudaLikeReplayTransferBackend.supports_async_submit is True
    assert CudaLikeReplayTransferBackend.supports_timing_events is True


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present")
def test_construction_without_a_device_says_what_is_missing():
    with pytest.raises(UnsupportedError, match=r"device 'cuda' requested but torch.cuda.is_available\(\) is False"):
        CudaLikeReplayTransferBackend(device="cuda", ring_depth=2)


def test_a_non_cuda_device_is_refused():
    with pytest.raises(ValueError, match=r"needs a 'cuda' device, got 'cpu'"):
        CudaLikeReplayTransferBackend(device="cpu", ring_depth=2)


@pytest.fixture
def backend():
    instance = CudaLikeReplayTransferBackend(device="cuda", ring_depth=2)
    yield instance
    instance.close()


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA)
class TestOnDevice:
    def test_family_and_resolved_index(self, backend):
        assert backend.device_family == ("rocm" if torch.version.hip else "cuda")
        assert backend.device.index == torch.cuda.current_device()

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
        total = dst.sum()  # queued on the current stream behind the event
        assert total.item() == src.sum().item()
        assert backend.ready_query(0)

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
