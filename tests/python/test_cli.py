"""`python -m tensorxfer info` reports facts that agree with independent probes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest

import tensorxfer
from tensorxfer import cli


def run_module(*args: str, timeout: float = 60.0) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tensorxfer", *args], capture_output=True,
                          text=True, timeout=timeout, env=os.environ.copy())


@pytest.fixture(scope="module")
def info() -> dict:
    result = run_module("info", "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_info_reports_version_and_compiled_features(info):
    assert info["version"] == tensorxfer.__version__
    compiled = tensorxfer.capabilities()
    assert info["compiled"] == {"cuda": bool(compiled["cuda"])}  # NUMA is no build option
    assert info["cpus"] == len(os.sched_getaffinity(0))


def test_info_reports_torch_and_devices(info):
    assert info["devices"]["cpu"] == 1
    try:
        import torch
    except ImportError:
        assert info["torch"] == {"installed": False, "version": "not installed"}
        assert info["devices"]["cuda"] == 0
        return
    assert info["torch"] == {"installed": True, "version": str(torch.__version__)}
    expected_cuda = torch.cuda.device_count() if torch.cuda.is_available() else 0
    assert info["devices"]["cuda"] == expected_cuda
    expected_mps = int(torch.backends.mps.is_available())
    assert info["devices"]["mps"] == expected_mps


def test_info_shm_space_agrees_with_statvfs(info):
    stats = os.statvfs("/dev/shm")
    assert info["shm"]["path"] == "/dev/shm"
    assert info["shm"]["total_bytes"] == stats.f_blocks * stats.f_frsize
    # Other processes may allocate between the two reads: allow 256 MiB of drift.
    assert abs(info["shm"]["free_bytes"] - stats.f_bavail * stats.f_frsize) <= 256 << 20


def test_info_numa_nodes_agree_with_sysfs(info):
    root = "/sys/devices/system/node"
    expected = sorted(int(m.group(1)) for name in (os.listdir(root) if os.path.isdir(root) else [])
                      if (m := re.fullmatch(r"node(\d+)", name)))
    assert info["numa_nodes"] == expected


def test_info_numa_reports_the_kernel_probes(info):
    numa = info["numa"]
    assert numa["supported"] == tensorxfer.capabilities()["numa"]
    assert sorted(numa["system_calls"]) == ["get_mempolicy", "mbind", "move_pages", "set_mempolicy"]
    placement = [numa["system_calls"][name]["permitted"] for name in ("get_mempolicy", "mbind", "move_pages")]
    assert numa["supported"] == all(placement)
    assert (numa["detail"] == "ok") == numa["supported"]
    assert [node["id"] for node in numa["nodes"]] == [node["id"] for node in tensorxfer._core.numa_online_nodes()]
    if os.path.isdir("/sys/devices/system/node"):
        assert set(info["numa_nodes"]) >= {node["id"] for node in numa["nodes"]}


def test_info_hugepages_agree_with_meminfo(info):
    with open("/proc/meminfo") as handle:
        text = handle.read()
    total = int(re.search(r"^HugePages_Total:\s+(\d+)", text, re.M).group(1))
    free = int(re.search(r"^HugePages_Free:\s+(\d+)", text, re.M).group(1))
    assert info["hugepages"]["total"] == total
    assert info["hugepages"]["free"] == free
    assert info["hugepages"]["explicit_available"] == (free > 0)


def _comm(pid: int) -> str:
    with open(f"/proc/{pid}/comm") as handle:
        return handle.read().strip()


def _can_read_child_memory() -> bool:
    """Independent probe: read a child's ELF header through /proc/<pid>/mem (same ptrace check)."""
    child = subprocess.Popen(["sleep", "30"])
    try:
        deadline = time.monotonic() + 5.0
        while _comm(child.pid) != "sleep" and time.monotonic() < deadline:
            time.sleep(0.001)  # until exec has replaced the forked copy of this process
        with open(f"/proc/{child.pid}/maps") as maps:
            start = int(maps.readline().split("-", 1)[0], 16)
        with open(f"/proc/{child.pid}/mem", "rb") as mem:
            mem.seek(start)
            return mem.read(4) == b"\x7fELF"
    except OSError:
        return False
    finally:
        child.kill()
        child.wait()


def test_info_cross_memory_attach_agrees_with_proc_mem(info):
    cma = info["cross_memory_attach"]
    assert cma["permitted"] == _can_read_child_memory(), cma
    scope_path = "/proc/sys/kernel/yama/ptrace_scope"
    expected_scope = int(open(scope_path).read()) if os.path.exists(scope_path) else None
    assert cma["ptrace_scope"] == expected_scope
    assert isinstance(cma["detail"], str) and cma["detail"]


def test_info_text_lists_every_field():
    result = run_module("info")
    assert result.returncode == 0, result.stderr
    for label in ("version", "compiled in", "torch", "devices", "/dev/shm free",
                  "cross-memory attach", "numa nodes", "numa system calls", "hugepages"):
        assert re.search(rf"^{re.escape(label)}\s", result.stdout, re.M), (label, result.stdout)
    assert tensorxfer.__version__ in result.stdout


def test_cli_main_in_process_prints_json(capsys):
    assert cli.main(["info", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["version"] == tensorxfer.__version__


def test_cli_without_command_prints_usage_and_fails(capsys):
    assert cli.main([]) == 2
    assert "usage:" in capsys.readouterr().err


def test_cli_unknown_command_is_a_usage_error():
    result = run_module("frobnicate")
    assert result.returncode == 2
    assert "invalid choice: 'frobnicate'" in result.stderr


def test_cli_info_rejects_unknown_option():
    result = run_module("info", "--no-such-option")
    assert result.returncode == 2
    assert "unrecognized arguments: --no-such-option" in result.stderr
