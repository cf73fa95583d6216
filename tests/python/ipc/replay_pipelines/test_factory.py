"""build_replay_transfer_backend: which backend for which device, and clear errors."""

from __future__ import annotations

import pytest

from tensorxfer import UnsupportedError
from tensorxfer.ipc.replay_pipelines.transfer import (
    HostReplayTransferBackend,
    ReplayTransferBackend,
    TorchCopyReplayTransferBackend,
    build_replay_transfer_backend,
)
from tensorxfer.ipc.replay_pipelines.transfer import cuda_like, torch_copy, xpu


@pytest.mark.parametrize("device", ["cpu", "cpu:0"])
def test_cpu_strings_build_the_host_backend(device):
    with build_replay_transfer_backend(device=device, ring_depth=2) as backend:
        assert type(backend) is HostReplayTransferBackend
        assert isinstance(backend, ReplayTransferBackend)
        assert backend.ring_depth == 2


def test_torch_cpu_device_builds_the_host_backend():
    torch = pytest.importorskip("torch")
    with build_replay_transfer_backend(device=torch.device("cpu"), ring_depth=3) as backend:
        assert type(backend) is HostReplayTransferBackend
        assert backend.device == torch.device("cpu")


class _Recorded:
    """Stands in for a backend class: records how the factory built it."""

    def __init__(self, *, device, ring_depth):
        self.device, self.ring_depth = device, ring_depth


@pytest.mark.parametrize(
    "device, module, class_name",
    [("cuda", cuda_like, "CudaLikeReplayTransferBackend"), ("cuda:1", cuda_like, "CudaLikeReplayTransferBackend"),
     ("xpu:0", xpu, "XpuReplayTransferBackend"), ("mps", torch_copy, "TorchCopyReplayTransferBackend"),
     ("privateuseone", torch_copy, "TorchCopyReplayTransferBackend")],
)
def test_device_type_selects_backend_module(monkeypatch, device, module, class_name):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(module, class_name, _Recorded)
    backend = build_replay_transfer_backend(device=device, ring_depth=5)
    assert type(backend) is _Recorded
    assert backend.device == torch.device(device) and backend.ring_depth == 5


def test_missing_cuda_device_names_what_is_missing():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    with pytest.raises(UnsupportedError) as raised:
        build_replay_transfer_backend(device="cuda:0", ring_depth=2)
    message = str(raised.value)
    assert "device 'cuda:0' requested but torch.cuda.is_available() is False" in message
    assert f"torch {torch.__version__}" in message
    if torch.version.cuda is None and torch.version.hip is None:
        assert "CPU-only build" in message


def test_missing_xpu_and_mps_devices_name_what_is_missing():
    torch = pytest.importorskip("torch")
    if not (hasattr(torch, "xpu") and torch.xpu.is_available()):
        with pytest.raises(UnsupportedError, match=r"device 'xpu' requested but torch.xpu.is_available\(\) is False"):
            build_replay_transfer_backend(device="xpu", ring_depth=2)
    if not torch.backends.mps.is_available():
        with pytest.raises(UnsupportedError, match=r"torch.backends.mps.is_available\(\) is False"):
            build_replay_transfer_backend(device=torch.device("mps"), ring_depth=2)


def test_cuda_index_beyond_visible_devices_is_refused(monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    expected = r"device 'cuda:3' requested but only 1 (CUDA|HIP) device\(s\) are visible"
    with pytest.raises(UnsupportedError, match=expected):
        build_replay_transfer_backend(device="cuda:3", ring_depth=2)


def test_meta_device_is_refused():
    pytest.importorskip("torch")
    with pytest.raises(UnsupportedError, match="holds no data"):
        build_replay_transfer_backend(device="meta", ring_depth=2)


def test_torch_copy_backend_is_built_for_other_present_devices():
    # "cpu" is the one device every machine has; construct the portable backend on it directly.
    pytest.importorskip("torch")
    with TorchCopyReplayTransferBackend(device="cpu", ring_depth=1) as backend:
        assert backend.device_family == "cpu" and backend.supports_async_submit is False


@pytest.mark.parametrize("device, error, message", [
    ("no-such-device", ValueError, "not a valid torch device string"),
    (0, TypeError, "device must be a str or torch.device, got int"),
    (None, TypeError, "device must be a str or torch.device, got NoneType"),
])
def test_bad_device_arguments(device, error, message):
    pytest.importorskip("torch")
    with pytest.raises(error, match=message):
        build_replay_transfer_backend(device=device, ring_depth=2)


@pytest.mark.parametrize("ring_depth, error", [(0, ValueError), (-1, ValueError), (1.5, TypeError),
                                               (False, TypeError), ("2", TypeError)])
def test_ring_depth_is_validated_before_anything_is_built(ring_depth, error):
    with pytest.raises(error, match="ring_depth"):
        build_replay_transfer_backend(device="cuda:0", ring_depth=ring_depth)


def test_keyword_only():
    with pytest.raises(TypeError):
        build_replay_transfer_backend("cpu", 2)  # type: ignore[misc]
