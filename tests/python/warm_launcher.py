"""Rank processes forked from a warm interpreter: the tests' launchers start workers with :func:`popen`.

A fresh ``python worker.py`` spends 2.5 s of CPU importing torch (5 s with megatron-core)
before its first line. The multi-process tests start hundreds of workers, and on two cores
those imports were most of the full tier's time. :func:`popen` takes the arguments of
``subprocess.Popen`` and returns a process that runs ``worker.py`` as ``python worker.py
args`` would, forked from a *zygote* (warm_zygote.py): an interpreter of this test run that
imported numpy, torch, torch.distributed, tensorxfer and the ``preload`` modules once. The
child is a real process of its own (pid, stdout, exit status or signal, normal interpreter
exit); what differs from a fresh interpreter is only that those modules were imported
before the script's first line, with the same import-time environment.

A launch starts a fresh interpreter (``subprocess.Popen``) instead when a fork could not
reproduce it:

- the command is not ``sys.executable script.py ...`` (mpirun, an nsenter or unshare
  prefix, ``-c``, ``-m``), or its output does not go to a pipe;
- ``TENSORXFER_TEST_FRESH_RANKS=1`` is set (every launch fresh: to check that the zygote
  changes no test's outcome).

The zygote is chosen by everything read at import time: the variables in
:data:`IMPORT_TIME_PREFIXES` (``OMP_NUM_THREADS``, ``PYTHONPATH``, ``TENSORXFER_CPU_*``, ...)
and the preload list; one zygote per combination, per test process, killed when the test
process exits (and exiting by itself when its parent is gone).
"""

from __future__ import annotations

import atexit
import json
import locale
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional, Sequence, Tuple, Union

ZYGOTE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "warm_zygote.py")
#: Environment variables read while numpy, torch or tensorxfer import: a launch whose values
#: differ from a zygote's needs another zygote.
IMPORT_TIME_PREFIXES = ("PYTHON", "OMP_", "KMP_", "GOMP_", "MKL_", "OPENBLAS_", "TENSORXFER_", "TORCH", "PYTORCH_",
                        "LD_", "MALLOC_", "CUDA_")
HEADER = struct.Struct("!I")

_zygotes: Dict[Tuple, Tuple[subprocess.Popen, str, str]] = {}  # (process, address, log)


def fresh_only() -> bool:
    return os.environ.get("TENSORXFER_TEST_FRESH_RANKS", "") not in ("", "0")


def _import_time_settings(env: Dict[str, str]) -> Tuple[Tuple[str, str], ...]:
    return tuple(sorted((key, value) for key, value in env.items() if key.startswith(IMPORT_TIME_PREFIXES)))


def _zygote_socket(key: Tuple, env: Dict[str, str]) -> str:
    """The listening address of the zygote for ``key`` (import-time settings, preload), started on first use."""
    preload = key[1]
    known = _zygotes.get(key)
    if known is not None and known[0].poll() is None:
        return known[1]
    if known is not None:
        raise RuntimeError(f"the test zygote exited ({known[0].returncode}); its output: {known[2]}")
    address = f"\0tensorxfer-test-zygote-{os.getpid()}-{len(_zygotes)}-{os.urandom(4).hex()}"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address)
    listener.listen(64)  # requests wait in the backlog while the zygote imports
    log = os.path.join(tempfile.gettempdir(), f"tensorxfer-test-zygote-{os.getpid()}-{len(_zygotes)}.log")
    with open(log, "wb") as log_file:
        zygote = subprocess.Popen([sys.executable, ZYGOTE, str(listener.fileno()), *preload], env=env,
                                  pass_fds=(listener.fileno(),), stdin=subprocess.DEVNULL, stdout=log_file,
                                  stderr=subprocess.STDOUT)
    listener.close()
    _zygotes[key] = (zygote, address, log)
    return address


@atexit.register
def _stop_zygotes() -> None:
    for zygote, _, log in _zygotes.values():
        zygote.kill()
        zygote.wait()
        os.unlink(log)


def _translate(data: bytes) -> str:
    """Decoded as ``subprocess.Popen(text=True)`` decodes (universal newlines)."""
    text = data.decode(locale.getpreferredencoding(False))
    return text.replace("\r\n", "\n").replace("\r", "\n")


class WarmProcess:
    """The subset of ``subprocess.Popen`` the launchers use, for a child of a zygote."""

    def __init__(self, args: List[str], pid: int, connection: socket.socket, stdout_fd: int, text: bool) -> None:
        self.args = args
        self.pid = pid
        self.returncode: Optional[int] = None
        self.stdin = None
        self.stderr = None
        self.stdout = open(stdout_fd, "r" if text else "rb", closefd=True)  # noqa: SIM115 - closed in communicate
        self._text = text
        self._connection = connection
        self._replies = b""
        self._output = bytearray()

    def _collect_status(self, timeout: Optional[float]) -> bool:
        """True once the exit status has come (within ``timeout``; None: wait)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            if b"\n" in self._replies:
                message = json.loads(self._replies.split(b"\n", 1)[0])
                self.returncode = os.waitstatus_to_exitcode(message["status"])
                self._connection.close()
                break
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([self._connection], [], [], left)[0]:
                return False
            chunk = self._connection.recv(4096)
            if not chunk:
                raise RuntimeError(f"the test zygote died before reporting how pid {self.pid} exited")
            self._replies += chunk
        return True

    def poll(self) -> Optional[int]:
        self._collect_status(0)
        return self.returncode

    def wait(self, timeout: Optional[float] = None) -> int:
        if not self._collect_status(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout)
        assert self.returncode is not None
        return self.returncode

    def communicate(self, input: Optional[str] = None, timeout: Optional[float] = None) -> Tuple[Union[str, bytes], None]:
        """Reads stdout to its end and waits; on ``timeout`` raises TimeoutExpired and keeps what was read."""
        assert input is None, "a warm process has no stdin"
        deadline = None if timeout is None else time.monotonic() + timeout
        if not self.stdout.closed:
            fd = self.stdout.fileno()
            while True:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                if not select.select([fd], [], [], left)[0]:
                    raise subprocess.TimeoutExpired(self.args, timeout, output=bytes(self._output))
                chunk = os.read(fd, 65536)
                if not chunk:
                    break
                self._output += chunk
            self.stdout.close()
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        self.wait(left)
        output = bytes(self._output)
        return (_translate(output) if self._text else output), None

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


def _forkable(args: Sequence[str], stdout, stderr) -> bool:
    return (len(args) >= 2 and args[0] == sys.executable and str(args[1]).endswith(".py")
            and stdout == subprocess.PIPE and stderr in (subprocess.STDOUT, subprocess.PIPE) and not fresh_only())


def popen(args: Sequence[str], *, env: Optional[Dict[str, str]] = None, stdout=None, stderr=None,
          text: bool = False, cwd: Optional[str] = None, preload: Sequence[str] = ()
          ) -> Union[subprocess.Popen, WarmProcess]:
    """``subprocess.Popen(args, env=env, stdout=stdout, stderr=stderr, text=text, cwd=cwd)``, forked
    from a warm zygote when the command is ``sys.executable script.py ...`` with its output piped
    (stderr into stdout or a pipe of its own is merged into stdout: callers read one stream)."""
    args = [str(arg) for arg in args]
    if not _forkable(args, stdout, stderr):
        return subprocess.Popen(args, env=env, stdout=stdout, stderr=stderr, text=text, cwd=cwd)
    environment = dict(os.environ if env is None else env)
    key = (_import_time_settings(environment), tuple(preload))
    address = _zygote_socket(key, environment)
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    connection.connect(address)
    read_end, write_end = os.pipe()
    with open(os.devnull, "rb") as devnull:
        body = json.dumps({"argv": args[1:], "env": environment, "cwd": cwd or os.getcwd()}).encode()
        socket.send_fds(connection, [HEADER.pack(len(body))], [devnull.fileno(), write_end, write_end])
        connection.sendall(body)
    os.close(write_end)
    reply = b""
    while b"\n" not in reply:
        chunk = connection.recv(4096)
        if not chunk:
            os.close(read_end)
            raise RuntimeError(f"the test zygote closed the connection before forking; its output: "
                               f"{_zygotes[key][2]}")
        reply += chunk
    line, rest = reply.split(b"\n", 1)
    process = WarmProcess(args, json.loads(line)["pid"], connection, read_end, text)
    process._replies = rest
    return process
