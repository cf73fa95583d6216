"""Python tests of the core's CUDA entry points against the fake CUDA runtime."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fake_core_loader import install  # noqa: E402

core = install()


@pytest.fixture(autouse=True)
def fresh_fake():
    """Every test starts on a fresh fake machine (one GPU, a matching driver)."""
    core.fake_cuda.reset()
    yield core.fake_cuda
    core.fake_cuda.reset()
