"""A run where torch sees a GPU but the core sees none fails instead of skipping the CUDA tests."""

from __future__ import annotations

import types

import pytest
from cuda_availability import core_misses_torchs_gpu, fail_if_the_core_misses_torchs_gpu

from tensorxfer import _core


def fake_torch(available: bool) -> types.SimpleNamespace:
    cuda = types.SimpleNamespace(is_available=lambda: available, device_count=lambda: 1 if available else 0)
    return types.SimpleNamespace(cuda=cuda, __version__="2.x")


def core_status(monkeypatch, *, compiled: bool, device_count: int) -> None:
    status = {"compiled": compiled, "runtime_version": 13000, "device_count": device_count,
              "reason": "cudaGetDeviceCount failed: CUDA driver version is insufficient" if device_count == 0 else ""}
    monkeypatch.setattr(_core, "cuda_status", lambda: status)


def test_torch_with_a_gpu_and_a_core_without_one_fails_the_run(monkeypatch):
    core_status(monkeypatch, compiled=True, device_count=0)
    reason = core_misses_torchs_gpu(fake_torch(True))
    assert reason is not None and "sees 1 CUDA device(s)" in reason and "insufficient" in reason
    with pytest.raises(pytest.fail.Exception, match="tensorxfer's core"):
        fail_if_the_core_misses_torchs_gpu(fake_torch(True))


@pytest.mark.parametrize("torch_gpu, compiled, devices", [(False, True, 0), (True, True, 1), (True, False, 0)])
def test_other_combinations_may_run_or_skip(monkeypatch, torch_gpu, compiled, devices):
    core_status(monkeypatch, compiled=compiled, device_count=devices)
    assert core_misses_torchs_gpu(fake_torch(torch_gpu)) is None
    fail_if_the_core_misses_torchs_gpu(fake_torch(torch_gpu))  # does not fail
