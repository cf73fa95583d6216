"""One conformance suite for every copy-service backend, in real process groups.

Each (backend, world size) group is started once per session and runs every
scenario of copy_service_scenarios; each test checks one scenario's result on
every rank. Adding a backend: one entry in copy_service_launch.LAUNCHERS and
WORLD_SIZES.
"""

from __future__ import annotations

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import copy_service_launch as launch  # noqa: E402
import copy_service_scenarios as scenarios  # noqa: E402

pytestmark = pytest.mark.multiprocess

GROUPS = [(backend, world) for backend, worlds in launch.WORLD_SIZES.items() for world in worlds]
# Tiers: each backend's smallest real group (local x1; mpi, torch and shm x2) is the fast tier's
# copy-service case (one launch runs every scenario), 4 ranks on 2 cores is stress, the rest full.
FAST_GROUPS = {("local", 1), ("mpi", 2), ("torch", 2), ("shm", 2)}


def group_param(backend: str, world: int):
    marks = [pytest.mark.fast] if (backend, world) in FAST_GROUPS else [pytest.mark.stress] if world >= 4 else []
    return pytest.param(backend, world, marks=marks, id=f"{backend}-x{world}")
_results: dict = {}
# A group's launch (every scenario, every rank) must end within its budget, and the budget stays
# under the pytest timeout of the test that pays for the launch: a hang is then reported by the
# launcher with every rank's output instead of being cut off by pytest-timeout.
LAUNCH_BUDGET_S = {"short": 90.0, "slow": 360.0}


def group_results(backend: str, world: int, size: str, tmp_path_factory) -> list:
    key = (backend, world, size)
    if key not in _results:
        reason = launch.unavailable(backend)
        if reason:
            _results[key] = reason
        else:
            out_dir = str(tmp_path_factory.mktemp(f"{backend}{world}{size}"))
            codes, output = launch.LAUNCHERS[backend](world, [out_dir, size, "conformance"], LAUNCH_BUDGET_S[size])
            per_rank = []
            for rank in range(world):
                path = os.path.join(out_dir, f"rank{rank}.json")
                if os.path.exists(path):
                    with open(path) as file:
                        per_rank.append(json.load(file))
                else:
                    per_rank.append(None)
            _results[key] = (codes, output, per_rank)
    result = _results[key]
    if isinstance(result, str):
        pytest.skip(result)
    return result


def check_scenario(backend, world, size, name, tmp_path_factory):
    codes, output, per_rank = group_results(backend, world, size, tmp_path_factory)
    for rank, results in enumerate(per_rank):
        assert results is not None and name in results, (
            f"rank {rank} of {backend} x{world} never reported {name} (exit codes {codes}):\n{output[-4000:]}"
        )
        assert results[name] == "ok", f"{backend} x{world}, rank {rank}, {name}:\n{results[name]}"
    assert codes == [0] * len(codes), f"exit codes {codes}:\n{output[-4000:]}"


@pytest.mark.parametrize("name", scenarios.ORDER)
@pytest.mark.parametrize("backend,world", [group_param(backend, world) for backend, world in GROUPS])
def test_conformance(backend, world, name, tmp_path_factory):
    check_scenario(backend, world, "short", name, tmp_path_factory)


SLOW = ["many_small_tensors", "large_tensors"]


@pytest.mark.stress
@pytest.mark.timeout(400)
@pytest.mark.parametrize("name", SLOW)
@pytest.mark.parametrize("backend,world", [("local", 1), ("mpi", 2), ("torch", 2), ("shm", 2)],
                         ids=["local", "mpi", "torch", "shm"])
def test_conformance_full_size(backend, world, name, tmp_path_factory):
    """10,000 small tensors and 64 MiB tensors."""
    check_scenario(backend, world, "slow", name, tmp_path_factory)
