"""NUMA on every install: the host calls with device=-1 work without libnuma, and each
refusal of the kernel (simulated by a seccomp filter in a child process) maps onto
the error hierarchy: UnifiedMemoryUnsupportedError where the kernel forbids a NUMA
system call (EPERM, ENOSYS), OSError with the errno for any other failure."""

from __future__ import annotations

import errno
import json

import numpy as np
import pytest
from numa_refusal import run_refusing, unavailable_reason
from unified_memory_helpers import PAGE, kernel_numa_refusal, numa_policy, page_count, resident_pages

import tensorxfer
from tensorxfer import _core
from tensorxfer.inference import unified_memory as um

needs_numa_kernel = pytest.mark.skipif(kernel_numa_refusal() is not None, reason=str(kernel_numa_refusal()))
needs_refusals = pytest.mark.skipif(unavailable_reason() is not None, reason=str(unavailable_reason()))


@needs_numa_kernel
def test_numa_is_available_wherever_the_kernel_allows_it():
    assert _core.numa_supported(), _core.numa_unsupported_reason()
    assert _core.numa_unsupported_reason() == ""
    assert tensorxfer.capabilities()["numa"] is True
    probes = _core.probe_numa_system_calls()
    assert [p["name"] for p in probes] == ["get_mempolicy", "set_mempolicy", "mbind", "move_pages"]
    assert all(p["permitted"] and p["errno"] == 0 and p["detail"] == "ok" for p in probes), probes


def _sysfs_nodes() -> list[int]:
    with open("/sys/devices/system/node/online") as online:
        text = online.read().strip()
    nodes: list[int] = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        nodes.extend(range(int(first), int(last or first) + 1))
    return nodes


@needs_numa_kernel
def test_nodes_come_from_sysfs():
    online = _core.numa_online_nodes()
    assert [node["id"] for node in online] == _sysfs_nodes()
    for node in online:
        with open(f"/sys/devices/system/node/node{node['id']}/meminfo") as meminfo:
            total_kib = int(next(line for line in meminfo if "MemTotal:" in line).split()[-2])
        assert node["memory_bytes"] == total_kib * 1024
    assert set(um.numa_nodes_with_memory()) <= {node["id"] for node in online if node["memory_bytes"]}
    assert _core.current_numa_node() in um.numa_nodes_with_memory()


@needs_numa_kernel
def test_host_calls_with_device_minus_one_do_what_the_host_can():
    with um.create_host_mempool() as pool:
        array = pool.empty(8 * PAGE, np.uint8)
        assert resident_pages(array) == 0
        assert um.prefetch_managed_tensor(array, device=-1) is None
        assert resident_pages(array) == page_count(array) == 8
        other = pool.empty(4 * PAGE, np.uint8)
        assert um.advise_managed_tensor_preferred_location(other, device=-1) is None
        policy = numa_policy(other)
        assert policy["mode"] == "preferred"
        assert policy["nodes"] == [policy["nodes"][0]] and policy["nodes"][0] in um.numa_nodes_with_memory()


@needs_numa_kernel
def test_module_calls_with_device_minus_one_return_the_documented_values():
    torch = pytest.importorskip("torch")
    with um.create_host_mempool() as pool:
        model = torch.nn.Linear(512, 256)
        model.weight = torch.nn.Parameter(pool.empty((256, 512), torch.float32))
        model.bias = torch.nn.Parameter(pool.empty((256,), torch.float32))
        assert um.prefetch_managed_module_parameters(model, device=-1) == (256 * 512 + 256) * 4
        assert all(resident_pages(p) == page_count(p) for p in model.parameters())
        assert um.advise_managed_module_parameters_preferred_location(model, device=-1) is None
        assert numa_policy(model.weight)["mode"] == "preferred"


@needs_numa_kernel
def test_bind_to_node_zero_and_an_invalid_node():
    nodes = um.numa_nodes_with_memory()
    if 0 not in nodes:
        pytest.skip(f"node 0 has no memory for this process here (nodes {nodes})")
    array = np.zeros(4 * PAGE, np.uint8)
    assert um.bind_to_numa_node(array, 0) is None
    assert set(um.numa_nodes_of(array)) == {0}
    beyond = max(_sysfs_nodes()) + 1
    with pytest.raises(ValueError, match=rf"bind_to_numa_node\(tensor\): node must be one of .*got {beyond}$"):
        um.bind_to_numa_node(array, beyond)


def _passes_in_refusing_child(system_call: str, error: int, checks: str) -> None:
    """Runs ``checks`` (asserts) after _PRELUDE in a child where ``system_call`` fails with ``error``."""
    result = run_refusing(system_call, error, _PRELUDE + checks + '\nprint("OK")\n')
    if result.stdout.startswith("SKIP"):
        pytest.skip(result.stdout.strip())
    assert result.returncode == 0 and result.stdout.strip() == "OK", result.stdout + result.stderr


_PRELUDE = """
import errno, numpy as np, tensorxfer
from tensorxfer import _core
from tensorxfer.inference import unified_memory as um
pool = um.create_host_mempool()
array = pool.zeros(4 * _core.page_size(), np.uint8)   # page-aligned: exactly 4 pages
node = um.numa_nodes_with_memory()[0]
def raised(call):
    try:
        call()
    except Exception as error:
        return error
    return None
"""


@needs_numa_kernel
@needs_refusals
@pytest.mark.multiprocess
@pytest.mark.parametrize("code, name", [(errno.EPERM, "EPERM"), (errno.ENOSYS, "ENOSYS")])
def test_a_kernel_forbidding_mbind_is_unsupported_naming_the_call(code, name):
    _passes_in_refusing_child("mbind", code, f"""
for call in (lambda: um.bind_to_numa_node(array, node),
             lambda: um.advise_managed_tensor_preferred_location(array, device=-1)):
    error = raised(call)
    assert isinstance(error, um.UnifiedMemoryUnsupportedError), repr(error)
    assert isinstance(error, tensorxfer.UnsupportedError)
    assert "mbind" in str(error) and "{name}" in str(error), str(error)
assert um.prefetch_managed_tensor(array, device=-1) is None   # no NUMA call: still works
assert len(um.numa_nodes_of(array)) == 4                      # move_pages is not refused
assert tensorxfer.capabilities()["numa"] is False
assert "mbind: {name}" in _core.numa_unsupported_reason(), _core.numa_unsupported_reason()
""")


@needs_numa_kernel
@needs_refusals
@pytest.mark.multiprocess
def test_a_kernel_forbidding_move_pages_is_unsupported():
    _passes_in_refusing_child("move_pages", errno.EPERM, """
error = raised(lambda: um.numa_nodes_of(array))
assert isinstance(error, um.UnifiedMemoryUnsupportedError), repr(error)
assert "move_pages" in str(error) and "EPERM" in str(error), str(error)
""")


@needs_numa_kernel
@needs_refusals
@pytest.mark.multiprocess
def test_other_system_call_failures_are_oserrors_with_the_errno():
    _passes_in_refusing_child("mbind", errno.EIO, """
error = raised(lambda: um.bind_to_numa_node(array, node))
assert type(error) is OSError and error.errno == errno.EIO, repr(error)
assert not isinstance(error, tensorxfer.UnsupportedError)
assert f"mbind(MPOL_BIND node {node}" in str(error), str(error)
""")


@needs_numa_kernel
@needs_refusals
@pytest.mark.multiprocess
def test_info_reports_what_the_kernel_refuses_instead_of_failing():
    result = run_refusing("mbind", errno.EPERM, exec_args=["-m", "tensorxfer", "info", "--json"])
    if result.stdout.startswith("SKIP"):
        pytest.skip(result.stdout.strip())
    assert result.returncode == 0, result.stderr
    numa = json.loads(result.stdout)["numa"]
    assert numa["supported"] is False
    assert numa["system_calls"]["mbind"]["permitted"] is False
    assert numa["system_calls"]["mbind"]["errno"] == errno.EPERM
    assert "seccomp" in numa["system_calls"]["mbind"]["detail"]
    for name in ("get_mempolicy", "set_mempolicy", "move_pages"):
        assert numa["system_calls"][name] == {"permitted": True, "errno": 0, "detail": "ok"}, name
    assert numa["nodes_with_memory"] == um.numa_nodes_with_memory()

    text = run_refusing("mbind", errno.EPERM, exec_args=["-m", "tensorxfer", "info"])
    assert text.returncode == 0, text.stderr
    assert "mbind no: EPERM" in text.stdout and "move_pages yes" in text.stdout, text.stdout
