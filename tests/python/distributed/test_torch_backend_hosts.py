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


def _check_against_gloo(reference, results, expected_hosts):
    world = len(results)
    for rank in range(world):
        assert results[rank].pop("hosts") == expected_hosts
        local_index = next(ranks.index(rank) for ranks in expected_hosts if rank in ranks)
        equal_hosts = len({len(ranks) for ranks in expected_hosts}) == 1
        assert results[rank].pop("delegated_ops") == 0, f"rank {rank} handed ops to flat gloo"
        cross = results[rank].pop("cross_host", None)
        if equal_hosts or local_index == 0:  # this rank ran the cross-host steps, over gloo
            assert cross is not None and cross[0] == "gloo" and cross[1] > 0, (rank, cross)
        else:
            assert cross is None, (rank, cross)
        assert reference[rank].keys() == results[rank].keys(), rank
        for key, value in reference[rank].items():
            got = results[rank][key]
            if key.startswith("random/"):  # every rank bitwise the same
                assert torch.equal(got, results[0][key]), (rank, key)
                continue
            assert got.dtype == value.dtype and torch.equal(got, value), (rank, key, got, value)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("sizes", [[2, 2], [1, 3]], ids=["2+2", "1+3"])
def test_hierarchical_collectives_match_flat_gloo(sizes, tmp_path):
    """Every accelerated op, composed across hosts, gives gloo's results; every host's /dev/shm ends empty."""
    world = sum(sizes)
    expected_hosts = []
    for size in sizes:
        start = sum(len(h) for h in expected_hosts)
        expected_hosts.append(list(range(start, start + size)))
    reference = workers.launch("hosts", world, "gloo", _out(tmp_path, "gloo"), timeout_s=150)
    with SimulatedHosts(sizes) as hosts:
        results = workers.launch("hosts", world, "tensorxfer", _out(tmp_path, "tx"), timeout_s=150,
                                 wrappers=hosts.wrappers)
        for host in range(len(sizes)):
            assert hosts.shm_listing(host) == [], f"host {host}'s /dev/shm not clean"
    _check_against_gloo(reference, results, expected_hosts)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_hosts_whose_ranks_interleave(tmp_path):
    """Ranks 0 and 2 on one host, 1 and 3 on the other: results still in global rank order."""
    reference = workers.launch("hosts", 4, "gloo", _out(tmp_path, "gloo"), timeout_s=150)
    with SimulatedHosts([2, 2]) as hosts:
        wrappers = [hosts.enter(rank % 2) for rank in range(4)]
        results = workers.launch("hosts", 4, "tensorxfer", _out(tmp_path, "tx"), timeout_s=150, wrappers=wrappers)
        for host in range(2):
            assert hosts.shm_listing(host) == [], f"host {host}'s /dev/shm not clean"
    _check_against_gloo(reference, results, [[0, 2], [1, 3]])
