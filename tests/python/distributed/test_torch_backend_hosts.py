"""The "tensorxfer" backend across simulated hosts (separate /dev/shm each), against flat gloo."""

from __future__ import annotations

import pytest

from conftest import torch_or_skip

torch = torch_or_skip()

import torch_backend_workers as workers  # noqa: E402
from tensorxfer.distributed.simulated_hosts import SimulatedHosts, unavailable_reason  # noqa: E402

pytestmark = [pytest.mark.multiprocess,
              pytest.mark.skipif(unavailable_reason() is not None, reason=str(unavailable_reason()))]


def _out(tmp_path, name):
    path = tmp_path / name
    path.mkdir()
    return str(path)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("sizes", [[2, 2], [1, 3]], ids=["2+2", "1+3"])
def test_hierarchical_collectives_match_flat_gloo(sizes, tmp_path):
    world = sum(sizes)
    expected_hosts = []
    for size in sizes:
        start = sum(len(h) for h in expected_hosts)
        expected_hosts.append(list(range(start, start + size)))
    reference = workers.launch("hosts", world, "gloo", _out(tmp_path, "gloo"), timeout_s=110)
    with SimulatedHosts(sizes) as hosts:
        results = workers.launch("hosts", world, "tensorxfer", _out(tmp_path, "tx"), timeout_s=110,
                                 wrappers=hosts.wrappers)
        for host in range(len(sizes)):
            assert hosts.shm_listing(host) == [], f"host {host}'s /dev/shm not clean"
    for rank in range(world):
        assert results[rank].pop("hosts") == expected_hosts
        for key, value in reference[rank].items():
            got = results[rank][key]
            if key.startswith("random/"):
                continue
            assert got.dtype == value.dtype and torch.equal(got, value), (rank, key)
        for key in results[rank]:
            if key.startswith("random/"):  # every rank bitwise the same
                assert torch.equal(results[rank][key], results[0][key]), (rank, key)
