"""What this build compiled in and what the machine offers now (``python -m tensorxfer info``).

Every probe is independent and never raises: a probe that cannot run reports
why in its ``detail`` field instead.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import platform
import resource
import subprocess
import sys
from typing import Any

SHM_DIR = "/dev/shm"
NUMA_DIR = "/sys/devices/system/node"
YAMA_PTRACE_SCOPE = "/proc/sys/kernel/yama/ptrace_scope"
THP_ENABLED = "/sys/kernel/mm/transparent_hugepage/enabled"


def _read_text(path: str) -> str | None:
    try:
        with open(path, encoding="ascii") as handle:
            return handle.read().strip()
    except OSError:
        return None


def torch_info() -> dict[str, Any]:
    """``{"installed", "version"}`` for torch, imported only here (it is optional)."""
    try:
        import torch
    except ImportError:
        return {"installed": False, "version": "not installed"}
    return {"installed": True, "version": str(torch.__version__)}


def torch_backend_info() -> dict[str, Any]:
    """``{"name", "registered", "detail"}``: is the "tensorxfer" torch.distributed backend registered."""
    from tensorxfer import distributed

    try:
        import torch.distributed as dist
    except ImportError:
        return {"name": distributed.BACKEND_NAME, "registered": False, "detail": "torch is not installed"}
    if not dist.is_available():
        return {"name": distributed.BACKEND_NAME, "registered": False,
                "detail": "this torch was built without torch.distributed"}
    registered = distributed.is_registered()
    return {"name": distributed.BACKEND_NAME, "registered": registered,
            "detail": 'init_process_group("tensorxfer") works' if registered else "registration failed"}


def devices() -> dict[str, Any]:
    """Device families usable now: ``{"cpu": 1, "cuda": n, "xpu": n, "mps": n}``.

    The CPU is always there; the others are counted through torch (0 without it),
    so they say what the torch-based backends can reach.
    """
    found: dict[str, Any] = {"cpu": 1, "cuda": 0, "xpu": 0, "mps": 0}
    try:
        import torch
    except ImportError:
        return found
    if torch.cuda.is_available():
        found["cuda"] = int(torch.cuda.device_count())
    xpu = getattr(torch, "xpu", None)
    if xpu is not None and xpu.is_available():
        found["xpu"] = int(xpu.device_count())
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        found["mps"] = 1
    return found


def shared_memory_space(path: str = SHM_DIR) -> dict[str, Any]:
    """Free and total bytes of the shared-memory file system at ``path``."""
    try:
        stats = os.statvfs(path)
    except OSError as error:
        return {"path": path, "free_bytes": None, "total_bytes": None, "detail": str(error)}
    return {
        "path": path,
        "free_bytes": stats.f_bavail * stats.f_frsize,
        "total_bytes": stats.f_blocks * stats.f_frsize,
    }


def _ptrace_scope() -> int | None:
    text = _read_text(YAMA_PTRACE_SCOPE)
    return int(text) if text is not None and text.lstrip("-").isdigit() else None


class _IoVec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


def _wait_for_exec(pid: int, command: str, timeout: float = 5.0) -> None:
    """Waits until the child ``pid`` runs ``command`` (until then it is a copy of us, mid-exec)."""
    import time

    deadline = time.monotonic() + timeout
    while _read_text(f"/proc/{pid}/comm") != command and time.monotonic() < deadline:
        time.sleep(0.001)


def _first_mapping_start(pid: int) -> int:
    # The first line of /proc/<pid>/maps is the executable's ELF header page.
    _wait_for_exec(pid, "sleep")
    with open(f"/proc/{pid}/maps", encoding="ascii") as maps:
        first = maps.readline()
    return int(first.split("-", 1)[0], 16)


def _probe_process_vm_readv() -> tuple[bool, str]:
    """Reads 4 bytes of a child process with process_vm_readv; expects its ELF magic."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    if not hasattr(libc, "process_vm_readv"):
        return False, "libc has no process_vm_readv"
    libc.process_vm_readv.restype = ctypes.c_ssize_t
    libc.process_vm_readv.argtypes = [
        ctypes.c_int, ctypes.POINTER(_IoVec), ctypes.c_ulong,
        ctypes.POINTER(_IoVec), ctypes.c_ulong, ctypes.c_ulong,
    ]
    try:
        child = subprocess.Popen(["sleep", "30"], stdin=subprocess.DEVNULL,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except OSError as error:
        return False, f"could not start a probe child: {error}"
    try:
        try:
            address = _first_mapping_start(child.pid)
        except (OSError, ValueError) as error:
            return False, f"cannot read /proc/{child.pid}/maps: {error}"
        buffer = ctypes.create_string_buffer(4)
        local = _IoVec(ctypes.cast(buffer, ctypes.c_void_p), 4)
        remote = _IoVec(address, 4)
        got = libc.process_vm_readv(child.pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
        if got < 0:
            code = ctypes.get_errno()
            return False, f"process_vm_readv on a child failed: {errno.errorcode.get(code, code)} ({os.strerror(code)})"
        if buffer.raw != b"\x7fELF":
            return False, f"process_vm_readv read {buffer.raw!r}, expected the ELF magic"
        return True, "process_vm_readv on a child process succeeded"
    finally:
        child.kill()
        child.wait()


def cross_memory_attach() -> dict[str, Any]:
    """Whether this process may read another process's memory (process_vm_readv / CMA).

    ``permitted`` is the result of a real probe on a child process;
    ``ptrace_scope`` is Yama's setting (None when Yama is absent): with 1 only
    descendants (or processes that allowed us with PR_SET_PTRACER) may be read,
    with 2 only privileged processes, with 3 nobody.
    """
    scope = _ptrace_scope()
    try:
        permitted, detail = _probe_process_vm_readv()
    except Exception as error:  # a probe must never break `info`
        permitted, detail = False, f"probe failed: {error!r}"
    siblings = None if not permitted else (scope in (None, 0))
    return {
        "permitted": permitted,
        "ptrace_scope": scope,
        "between_unrelated_processes": siblings,
        "detail": detail,
    }


def futexes_across_processes() -> dict[str, Any]:
    """Whether a futex wake in one process reaches a sleeper in another (a real fork test).

    Every wait between processes (slot rings, groups, collectives) sleeps on
    such futexes; where they do not work, waits would only end by timeout.
    """
    try:
        from tensorxfer import _core

        works, detail = _core.probe_futex_across_processes()
    except Exception as error:  # a probe must never break `info`
        works, detail = False, f"probe failed: {error!r}"
    return {"works": bool(works), "detail": str(detail)}


def numa_nodes(path: str = NUMA_DIR) -> list[int]:
    """NUMA node ids the kernel exposes (empty when the kernel has no NUMA support)."""
    try:
        names = os.listdir(path)
    except OSError:
        return []
    return sorted(int(name[4:]) for name in names if name.startswith("node") and name[4:].isdigit())


def _id_ranges(ids: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2,5"`` (the kernel's list format)."""
    ranges: list[list[int]] = []
    for value in ids:
        if ranges and value == ranges[-1][1] + 1:
            ranges[-1][1] = value
        else:
            ranges.append([value, value])
    return ",".join(str(first) if first == last else f"{first}-{last}" for first, last in ranges)


def numa() -> dict[str, Any]:
    """NUMA as the kernel offers it now; no library is involved.

    ``system_calls`` maps each NUMA system call (get_mempolicy, set_mempolicy, mbind,
    move_pages) to ``{"permitted", "errno", "detail"}`` from a harmless real call:
    in a container a seccomp profile may answer EPERM, a kernel without NUMA ENOSYS.
    ``supported`` says whether the calls placement uses work (``capabilities()["numa"]``).
    ``nodes`` are the online nodes of /sys/devices/system/node (``id``, ``cpus``,
    ``memory_bytes``); ``nodes_with_memory`` those this process may allocate on.
    """
    try:
        from tensorxfer import _core

        calls = {probe["name"]: {"permitted": bool(probe["permitted"]), "errno": int(probe["errno"]),
                                 "detail": str(probe["detail"])}
                 for probe in _core.probe_numa_system_calls()}
        reason = _core.numa_unsupported_reason()
        nodes = [dict(node) for node in _core.numa_online_nodes()]
        with_memory = list(_core.numa_nodes_with_memory())
    except Exception as error:  # a probe must never break `info`
        return {"supported": False, "detail": f"probe failed: {error!r}", "system_calls": {},
                "nodes": [], "nodes_with_memory": []}
    return {"supported": not reason, "detail": reason or "ok", "system_calls": calls,
            "nodes": nodes, "nodes_with_memory": with_memory}


def _numa_text(info: dict[str, Any]) -> tuple[str, str]:
    nodes = "; ".join(f"{node['id']} (cpus {_id_ranges(node['cpus']) or 'none'}, {_bytes(node['memory_bytes'])})"
                      for node in info["nodes"]) or "none in sysfs"
    calls = ", ".join(f"{name} {'yes' if call['permitted'] else 'no: ' + call['detail']}"
                      for name, call in info["system_calls"].items()) or info["detail"]
    return nodes, calls


def hugepages() -> dict[str, Any]:
    """Explicit huge pages (HugePages_* in /proc/meminfo) and transparent huge page mode."""
    info: dict[str, Any] = {"hugepage_size_bytes": None, "total": 0, "free": 0,
                            "transparent": None}
    meminfo = _read_text("/proc/meminfo") or ""
    for line in meminfo.splitlines():
        key, _, value = line.partition(":")
        parts = value.split()
        if key == "HugePages_Total" and parts:
            info["total"] = int(parts[0])
        elif key == "HugePages_Free" and parts:
            info["free"] = int(parts[0])
        elif key == "Hugepagesize" and parts:
            info["hugepage_size_bytes"] = int(parts[0]) * 1024
    thp = _read_text(THP_ENABLED)
    if thp is not None and "[" in thp:
        info["transparent"] = thp.split("[", 1)[1].split("]", 1)[0]
    info["explicit_available"] = info["free"] > 0
    return info


def _memlock_limit() -> int | None:
    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    return None if soft == resource.RLIM_INFINITY else int(soft)


def collect() -> dict[str, Any]:
    """Everything ``info`` reports, as a JSON-serialisable dict."""
    import tensorxfer

    compiled = tensorxfer.capabilities()
    return {
        "version": tensorxfer.__version__,
        "compiled": {"cuda": bool(compiled["cuda"])},
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": len(os.sched_getaffinity(0)),
        "cpu": _cpu_features(),
        "torch": torch_info(),
        "torch_distributed_backend": torch_backend_info(),
        "devices": devices(),
        "shm": shared_memory_space(),
        "cross_memory_attach": cross_memory_attach(),
        "futexes_across_processes": futexes_across_processes(),
        "numa_nodes": numa_nodes(),
        "numa": numa(),
        "hugepages": hugepages(),
        "memlock_limit_bytes": _memlock_limit(),
    }


def _bytes(value: int | None) -> str:
    if value is None:
        return "unknown"
    scaled = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if scaled < 1024 or unit == "TiB":
            return f"{scaled:.1f} {unit}" if unit != "B" else f"{value} B"
        scaled /= 1024
    return str(value)


def _cpu_features() -> dict[str, Any]:
    from tensorxfer import _core

    return dict(_core.cpu_features())


def cpu_summary(cpu: dict[str, Any]) -> str:
    """``_core.cpu_features()`` in one line: vendor, family, model, AVX2/AVX-512, the kernels' vector
    set, the last-level cache and the usable CPUs; a ``TENSORXFER_CPU_*`` override is marked ``forced``."""

    def forced(key: str) -> str:
        return " (forced)" if cpu[key] else ""

    cache = cpu["last_level_cache_bytes"]
    cache_text = f"{cache / 2**20:g} MiB" if cache >= 2**20 else f"{cache >> 10} KiB" if cache else "unknown"
    yes_no = {True: "yes", False: "no"}
    return (f"{cpu['vendor'] or '?'} family {cpu['family']} model {cpu['model']}; "
            f"AVX2 {yes_no[cpu['avx2']]}, AVX-512 {yes_no[cpu['avx512']]}; "
            f"kernels {cpu['vector_set']}{forced('vector_set_forced')}; "
            f"last-level cache {cache_text}{forced('cache_forced')}; "
            f"{cpu['usable_cpus']} CPUs{forced('cpus_forced')}")


def format_text(info: dict[str, Any]) -> str:
    """The human-readable form of :func:`collect`'s result."""
    yes = {True: "yes", False: "no", None: "unknown"}
    compiled = ", ".join(f"{key}={yes[val]}" for key, val in info["compiled"].items())
    devices_text = ", ".join(f"{name}:{count}" for name, count in info["devices"].items())
    shm = info["shm"]
    cma = info["cross_memory_attach"]
    scope = "no yama" if cma["ptrace_scope"] is None else f"yama ptrace_scope={cma['ptrace_scope']}"
    huge = info["hugepages"]
    memlock = info["memlock_limit_bytes"]
    numa_nodes_text, numa_calls_text = _numa_text(info["numa"])
    lines = [
        ("version", info["version"]),
        ("compiled in", compiled),
        ("python", f"{info['python']} on {info['platform']}"),
        ("cpus", str(info["cpus"])),
        ("cpu", cpu_summary(info["cpu"])),
        ("torch", info["torch"]["version"]),
        ("torch.distributed backend", f"{info['torch_distributed_backend']['name']}: "
                                      f"{'registered' if info['torch_distributed_backend']['registered'] else 'not registered'}"
                                      f" ({info['torch_distributed_backend']['detail']})"),
        ("devices", devices_text),
        ("/dev/shm free", f"{_bytes(shm['free_bytes'])} of {_bytes(shm['total_bytes'])}"),
        ("cross-memory attach", f"{yes[cma['permitted']]} ({scope}; {cma['detail']})"),
        ("futexes across processes", f"{yes[info['futexes_across_processes']['works']]} "
                                     f"({info['futexes_across_processes']['detail']})"),
        ("numa nodes", numa_nodes_text),
        ("numa system calls", numa_calls_text),
        ("hugepages", f"{huge['free']}/{huge['total']} free of {_bytes(huge['hugepage_size_bytes'])}, "
                      f"transparent={huge['transparent']}"),
        ("memlock limit", "unlimited" if memlock is None else _bytes(memlock)),
    ]
    width = max(len(key) for key, _ in lines)
    return "\n".join(f"{key:<{width}}  {value}" for key, value in lines)


def main_info(as_json: bool) -> int:
    """Prints the report (JSON when ``as_json``); returns the exit code."""
    import json

    info = collect()
    print(json.dumps(info, indent=2, sort_keys=True) if as_json else format_text(info))
    sys.stdout.flush()
    return 0
