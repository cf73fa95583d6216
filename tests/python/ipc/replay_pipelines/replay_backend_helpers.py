"""Helpers shared by the replay transfer backend tests: the backend cases (every
replay transfer backend on every device it targets; those whose device this
machine lacks are skipped with the reason), their fixtures, and a recording
trace recorder.  Kept out of conftest.py so that no test's ``import conftest``
resolves to this directory."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, List

import numpy as np
import pytest


def _torch():
    try:
        import torch
    except ImportError:
        return None
    return torch


def _cuda_reason():
    torch = _torch()
    if torch is None:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA device: torch.cuda.is_available() is False"
    return None


def _xpu_reason():
    torch = _torch()
    if torch is None:
        return "torch is not installed"
    if not (hasattr(torch, "xpu") and torch.xpu.is_available()):
        return "no XPU device: torch.xpu.is_available() is False"
    return None


def _mps_reason():
    torch = _torch()
    if torch is None:
        return "torch is not installed"
    if not torch.backends.mps.is_available():
        return "no MPS device: torch.backends.mps.is_available() is False"
    return None


@dataclasses.dataclass
class BackendCase:
    """How to build one backend, and what its device slots look like."""

    name: str
    build: Callable[..., Any]
    device: str
    numpy_device_slots: bool  # allocate_device_slots(dtype="float32") gives numpy arrays


def _host(ring_depth: int):
    from tensorxfer.ipc.replay_pipelines.transfer import HostReplayTransferBackend

    return HostReplayTransferBackend(device="cpu", ring_depth=ring_depth)


def _torch_copy(device: str):
    def build(ring_depth: int):
        from tensorxfer.ipc.replay_pipelines.transfer import TorchCopyReplayTransferBackend

        return TorchCopyReplayTransferBackend(device=device, ring_depth=ring_depth)

    return build


def _cuda_like(ring_depth: int):
    from tensorxfer.ipc.replay_pipelines.transfer import CudaLikeReplayTransferBackend

    return CudaLikeReplayTransferBackend(device="cuda", ring_depth=ring_depth)


def _xpu(ring_depth: int):
    from tensorxfer.ipc.replay_pipelines.transfer import XpuReplayTransferBackend

    return XpuReplayTransferBackend(device="xpu", ring_depth=ring_depth)


def _case_params() -> List[Any]:
    params = [pytest.param(BackendCase("host", _host, "cpu", True), id="host-cpu")]
    torch_missing = "torch is not installed" if _torch() is None else None
    cases = [
        ("torch_copy-cpu", BackendCase("torch_copy", _torch_copy("cpu"), "cpu", False), torch_missing),
        ("torch_copy-mps", BackendCase("torch_copy", _torch_copy("mps"), "mps", False), _mps_reason()),
        ("cuda_like-cuda", BackendCase("cuda_like", _cuda_like, "cuda", False), _cuda_reason()),
        ("xpu-xpu", BackendCase("xpu", _xpu, "xpu", False), _xpu_reason()),
    ]
    for case_id, case, reason in cases:
        marks = [pytest.mark.skip(reason=reason)] if reason else []
        if case.name == "cuda_like":
            marks.append(pytest.mark.cuda)
        params.append(pytest.param(case, id=case_id, marks=marks))
    return params


@pytest.fixture(params=_case_params())
def case(request) -> BackendCase:
    """One backend kind (parametrized over all of them)."""
    return request.param


@pytest.fixture
def backend(case):
    """A fresh backend with ring_depth 4, closed after the test."""
    instance = case.build(4)
    yield instance
    instance.close()


def to_numpy(tensor: Any) -> np.ndarray:
    """A host numpy copy of a numpy array or a torch tensor on any device."""
    if isinstance(tensor, np.ndarray):
        return tensor.copy()
    return tensor.detach().cpu().numpy()


class RecordingTraceRecorder:
    """A trace recorder that keeps every call."""

    def __init__(self) -> None:
        self.slices: List[tuple] = []
        self.pending_spans: List[tuple] = []

    def add_slice(self, name, category, begin_ns, end_ns, args) -> None:
        self.slices.append((name, category, begin_ns, end_ns, dict(args)))

    def add_cuda_pending_span(self, name, category, cpu_begin_ns, start_event, end_event, args) -> None:
        self.pending_spans.append((name, category, cpu_begin_ns, start_event, end_event, dict(args)))
