"""Run Python code in a child process whose kernel refuses one NUMA system call.

A seccomp filter (installed through ctypes, as a container runtime's profile would
be) makes the chosen system call fail with the chosen errno and lets every other
call through; the filter stays on across ``exec``. The child is a fresh
interpreter, so a crash is a failed test rather than a dead test run.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import textwrap
from typing import Optional

# The system call numbers (asm/unistd.h) on the architectures the tests know.
SYSTEM_CALLS = {
    "x86_64": {"mbind": 237, "set_mempolicy": 238, "get_mempolicy": 239, "move_pages": 279},
    "aarch64": {"mbind": 235, "get_mempolicy": 236, "set_mempolicy": 237, "move_pages": 239},
}

_INSTALL_FILTER = """
import ctypes, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
ret_errno, ret_allow = 0x00050000, 0x7FFF0000  # SECCOMP_RET_ERRNO, SECCOMP_RET_ALLOW
program = [
    (0x20, 0, 0, 0),                        # BPF_LD|BPF_W|BPF_ABS: seccomp_data.nr
    (0x15, 0, 1, {number}),                 # BPF_JMP|BPF_JEQ|BPF_K: the refused call?
    (0x06, 0, 0, ret_errno | {error}),      # BPF_RET: fail with the errno
    (0x06, 0, 0, ret_allow),                # BPF_RET: allow everything else
]
code = ctypes.create_string_buffer(b"".join(struct.pack("HBBI", *op) for op in program))
class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
fprog = SockFprog(len(program), ctypes.addressof(code))
ulong = ctypes.c_ulong
if (libc.prctl(38, ulong(1), ulong(0), ulong(0), ulong(0)) != 0  # PR_SET_NO_NEW_PRIVS
        or libc.prctl(22, ulong(2), ctypes.byref(fprog), ulong(0), ulong(0)) != 0):  # SECCOMP_MODE_FILTER
    print("SKIP seccomp filter refused: errno", ctypes.get_errno())
    sys.exit(0)
"""


def unavailable_reason() -> Optional[str]:
    """Why refusals cannot be simulated here, or None."""
    if platform.system() != "Linux":
        return "seccomp filters are Linux only"
    if platform.machine() not in SYSTEM_CALLS:
        return f"no system call numbers for {platform.machine()}"
    return None


def run_refusing(system_call: str, error: int, code: str = "", *, exec_args: Optional[list[str]] = None
                 ) -> subprocess.CompletedProcess:
    """Runs ``code`` (or, after the filter, execs ``exec_args``) with ``system_call`` failing with ``error``."""
    number = SYSTEM_CALLS[platform.machine()][system_call]
    script = _INSTALL_FILTER.format(number=number, error=error)
    if exec_args is not None:
        script += f"import os\nos.execv(sys.executable, [sys.executable] + {exec_args!r})\n"
    else:
        script += textwrap.dedent(code)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=env)
