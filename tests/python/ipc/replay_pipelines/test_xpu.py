"""XPU backend: the reference's class attributes and the no-device error run everywhere;
device tests skip without an XPU."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

from tensorxfer import UnsupportedError
from tensorxfer.ipc.replay_pipelines.transfer import ReplayTransferBackend, XpuReplayTransferBackend

torch = pytest.importorskip("torch", reason="torch is not installed (pip install .[torch])")
HAS_XPU = hasattr(torch, "xpu") and torch.xpu.is_available()
NO_XPU = "no XPU device: torch.xpu.is_available() is False"


def test_class_attributes_match_the_reference():
    expected = {
        "device_family": "xpu",
        "h2d_submitter": "torch_xpu_copy_stream",
        "host_memory_kind": "pageable_shared",
        "host_pinned": False,
        "direct_pinned_shared": False,
        "supports_async_submit": True,
        "supports_timing_events": False,
    }
    for name, value in expected.items():
        actual = getattr(XpuReplayTransferBackend, name)
        assert actual == value and type(actual) is type(value), name


def test_constructor_is_keyword_only_device_and_ring_depth():
    parameters = inspect.signature(XpuReplayTransferBackend.__init__).parameters
    assert [name for name in parameters if name != "self"] == ["device", "ring_depth"]
    assert all(parameters[name].kind is inspect.Parameter.KEYWORD_ONLY for name in ("device", "ring_depth"))


@pytest.mark.skipif(HAS_XPU, reason="an XPU is present")
def test_construction_without_a_device_says_what_is_missing():
    with pytest.raises(UnsupportedError, match=r"device 'xpu:0' requested but torch.xpu.is_available\(\) is False"):
        XpuReplayTransferBackend(device="xpu:0", ring_depth=2)


def test_a_non_xpu_device_is_refused():
    with pytest.raises(ValueError, match=r"needs a 'xpu' device, got 'cpu'"):
        XpuReplayTransferBackend(device="cpu", ring_depth=2)


@pytest.mark.skipif(not HAS_XPU, reason=NO_XPU)
class TestOnDevice:
    def test_protocol_and_round_trip(self):
        with XpuReplayTransferBackend(device="xpu", ring_depth=2) as backend:
            assert isinstance(backend, ReplayTransferBackend)
            src = np.arange(1 << 16, dtype=np.float32)
            backend.register_host_slots([src])
            assert backend.host_pinned is False
            dst = backend.allocate_device_slots(count=1, shape=src.shape, dtype=np.float32)[0]
            backend.submit_h2d(slot=1, dst=dst, src=src)
            backend.wait_current_stream_for_ready(1)
            assert float(dst.sum().item()) == float(src.sum())
            backend.synchronize_ready(1)
            assert backend.ready_query(1)
