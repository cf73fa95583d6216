"""Backends under test: every replay transfer backend, on every device it targets.

Those whose device this machine lacks are skipped with the reason.
"""

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


def _absent(reason: str):
    return pytest.param(None, marks=pytest.mark.skip(reason=reason))


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
