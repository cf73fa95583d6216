"""NUMA placement of host tensors: bind_to_numa_node and numa_nodes_of, page by page."""

from __future__ import annotations

import errno

import numpy as np
import pytest
from unified_memory_helpers import PAGE, kernel_numa_refusal, numa_policy

from tensorxfer.inference import unified_memory as um

# Every install makes the NUMA system calls itself: these run wherever the kernel has
# NUMA and no seccomp filter refuses it (test_numa_syscalls.py covers the refusals).
pytestmark = pytest.mark.skipif(kernel_numa_refusal() is not None, reason=str(kernel_numa_refusal()))


@pytest.fixture
def nodes():
    found = um.numa_nodes_with_memory()
    assert found, "a NUMA-capable kernel lists at least one node"
    return found


def test_nodes_of_reports_each_page_resident_or_not(nodes):
    with um.create_host_mempool() as pool:
        array = pool.empty(6 * PAGE, np.uint8)
        array[2 * PAGE : 4 * PAGE] = 1  # pages 2 and 3 only
        status = um.numa_nodes_of(array)
        assert len(status) == 6
        assert status[0] == status[1] == status[4] == status[5] == -errno.ENOENT
        assert status[2] in nodes and status[3] in nodes


def test_bind_places_every_page_on_the_node(nodes):
    torch = pytest.importorskip("torch")
    for node in nodes:
        with um.create_host_mempool() as pool:
            array = pool.empty(16 * PAGE, np.uint8)
            array[: 8 * PAGE] = 1  # resident before the bind: moved
            um.bind_to_numa_node(array, node)
            array[8 * PAGE :] = 2  # faulted in under the policy
            assert um.numa_nodes_of(array) == [node] * 16
            assert numa_policy(array) == {"mode": "bind", "nodes": [node]}
            tensor = pool.zeros((4 * PAGE // 4,), torch.float32)
            um.bind_to_numa_node(tensor, node)
            assert um.numa_nodes_of(tensor) == [node] * 4


def test_bind_on_ordinary_numpy_memory(nodes):
    array = np.ones(10 * PAGE, np.uint8)
    um.bind_to_numa_node(array, nodes[0])
    status = um.numa_nodes_of(array)
    assert len(status) in (10, 11)  # the array need not start on a page boundary
    assert set(status) == {nodes[0]}


@pytest.mark.parametrize("node", [-2, -1, 1, 999])
def test_invalid_nodes_are_refused_listing_the_valid_ones(nodes, node):
    if node in nodes:
        pytest.skip(f"node {node} exists on this machine")
    array = np.ones(PAGE, np.uint8)
    listed = ", ".join(str(n) for n in nodes)
    with pytest.raises(ValueError, match=rf"node must be one of .*\[{listed}\], got {node}"):
        um.bind_to_numa_node(array, node)


def test_bad_arguments(nodes):
    with pytest.raises(TypeError, match="node"):
        um.bind_to_numa_node(np.ones(4), "0")
    with pytest.raises(TypeError, match="node"):
        um.bind_to_numa_node(np.ones(4), True)
    with pytest.raises(ValueError, match="C-contiguous"):
        um.bind_to_numa_node(np.ones((4, 4))[:, 1], nodes[0])
    with pytest.raises(TypeError, match="tensor"):
        um.numa_nodes_of("abc")
    assert um.numa_nodes_of(np.empty(0)) == []
    um.bind_to_numa_node(np.empty(0), nodes[0])  # empty: a no-op


def test_meta_tensor_is_refused():
    torch = pytest.importorskip("torch")
    with pytest.raises(ValueError, match="device meta"):
        um.numa_nodes_of(torch.empty(4, device="meta"))
