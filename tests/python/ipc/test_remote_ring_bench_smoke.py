"""bench/python/bench_replay_hosts.py runs end to end (one collector, small cases) and prints its table."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from child_process import child_environment
from conftest import torch_or_skip

torch_or_skip()

from simulated_hosts import unavailable_reason  # noqa: E402

BENCH = Path(__file__).resolve().parents[3] / "bench" / "python" / "bench_replay_hosts.py"


@pytest.mark.stress
@pytest.mark.multiprocess
@pytest.mark.timeout(300)
@pytest.mark.skipif(unavailable_reason() is not None, reason=str(unavailable_reason()))
def test_bench_replay_hosts_quick_prints_the_floors_and_the_latency():
    done = subprocess.run([sys.executable, str(BENCH), "--quick", "--mib", "4", "--sizes-kib", "64"],
                          env=child_environment(), capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stderr[-4000:]
    out = done.stdout
    assert out.startswith("CPU: ")
    assert "1 x    64 KiB" in out and "ring/engine" in out and "engine/socket" in out
    assert "latency p50: publish -> acquire_ready" in out and "gloo one way" in out
    assert "/dev/shm not clean" not in out
