"""Helpers shared by the unified-memory tests."""

from __future__ import annotations

import os
from typing import Any, Optional, Tuple

from tensorxfer import _core
from tensorxfer._tensor import as_view

PAGE = _core.page_size()


def resident_pages(tensor: Any) -> int:
    """Pages of ``tensor`` resident in RAM now (mincore)."""
    return _core.resident_page_count(as_view(tensor, "tensor"), "tensor")


def page_count(tensor: Any) -> int:
    """Whole pages ``tensor`` covers."""
    view = as_view(tensor, "tensor")
    if view.nbytes == 0:
        return 0
    first = view.data_ptr // PAGE
    last = (view.data_ptr + view.nbytes - 1) // PAGE
    return last - first + 1


def _seccomp_mode() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("Seccomp:"):
                return int(line.split()[1])
    return -1


def kernel_numa_refusal() -> Optional[str]:
    """Why the kernel may refuse NUMA system calls here, or None where they must work.

    Decided without the code under test where possible: no /sys/devices/system/node
    (a kernel without NUMA), or a seccomp filter on this process that refuses them.
    Every install makes the calls itself, so elsewhere a refusal is a bug.
    """
    if not os.path.isdir("/sys/devices/system/node"):
        return "this kernel has no NUMA support (no /sys/devices/system/node)"
    if _seccomp_mode() != 0 and not _core.numa_supported():
        return f"a seccomp filter refuses NUMA system calls here: {_core.numa_unsupported_reason()}"
    return None


def numa_policy(tensor: Any) -> dict:
    """The memory policy of the first page of ``tensor`` (get_mempolicy)."""
    return _core.numa_policy_of(as_view(tensor, "tensor"), "tensor")


def gpu_status() -> Tuple[bool, str]:
    """(a CUDA device is usable by the core, the reason when it is not)."""
    status = _core.cuda_status()
    return status["device_count"] > 0, status["reason"]


def mapping_containing(address: int) -> Optional[str]:
    """The /proc/self/maps line of the mapping containing ``address``, or None."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            begin, end = (int(part, 16) for part in line.split()[0].split("-"))
            if begin <= address < end:
                return line.strip()
    return None


def reset_compile_state(monkeypatch: Any) -> None:
    """Puts tensorxfer.inference.unified_memory back to UNATTEMPTED through
    `monkeypatch`, so the real state is restored after the test."""
    from tensorxfer.inference import unified_memory as um

    for name, value in [
        ("_compilation_state", um.CompilationState.UNATTEMPTED),
        ("_alloc", None),
        ("_mod", None),
        ("_so_path", None),
        ("_compilation_error", None),
        ("_compilation_timed_out", False),
        ("_background_compile", None),
    ]:
        monkeypatch.setattr(um, name, value)
