"""A peer that dies, or never calls run(): the survivors raise within their timeout.

Real process groups (mpirun / spawned gloo ranks); the last rank SIGKILLs
itself (or idles) after one good run, the others run again with a 5 s timeout.
"""

from __future__ import annotations

import json
import os
import re
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import copy_service_launch as launch  # noqa: E402

pytestmark = pytest.mark.multiprocess

FAILURE_TIMEOUT = 5.0  # copy_service_worker.FAILURE_TIMEOUT
BACKENDS = [name for name in launch.LAUNCHERS if name != "local"]


def survivors(backend: str, world: int, mode: str, tmp_path) -> list:
    reason = launch.unavailable(backend)
    if reason:
        pytest.skip(reason)
    codes, output = launch.LAUNCHERS[backend](world, [str(tmp_path), "short", mode], 90.0)
    results = []
    for rank in range(world - 1):
        path = tmp_path / f"rank{rank}.json"
        assert path.exists(), f"survivor rank {rank} reported nothing (exit codes {codes}):\n{output[-4000:]}"
        results.append(json.loads(path.read_text()))
    return results


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("backend", BACKENDS)
def test_killed_peer_is_reported_within_the_timeout(backend, world, tmp_path):
    for rank, result in enumerate(survivors(backend, world, "kill", tmp_path)):
        assert result["error"] in ("PeerLostError", "TimeoutError"), f"rank {rank}: {result}"
        assert result["again"].startswith("RuntimeError:") and "an earlier run failed" in result["again"], result
        assert result["seconds"] < FAILURE_TIMEOUT + 2.0, f"rank {rank} took {result['seconds']:.1f} s: {result}"
        if result["error"] == "PeerLostError":  # names a rank that died (a survivor may exit first)
            assert re.search(r"rank \d+ died|peer .* was lost", result["message"]), result


@pytest.mark.parametrize("backend", BACKENDS)
def test_killed_same_host_peer_is_named_quickly(backend, tmp_path):
    """On one host the death is seen by liveness (mpi) or the closed connection (gloo), not the timeout."""
    (result,) = survivors(backend, 2, "kill", tmp_path)
    assert result["error"] == "PeerLostError", result
    assert result["seconds"] < FAILURE_TIMEOUT, result


@pytest.mark.parametrize("backend", BACKENDS)
def test_peer_that_never_calls_run_times_out(backend, tmp_path):
    (result,) = survivors(backend, 2, "idle", tmp_path)
    assert result["error"] == "TimeoutError", result
    assert FAILURE_TIMEOUT - 0.5 <= result["seconds"] < FAILURE_TIMEOUT + 3.0, result
    assert "run()" in result["message"], result
