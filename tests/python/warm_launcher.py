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

- the command is not ``sys.executable script.py ...``, bare or behind ``nsenter -t PID``
  with ``--net``/``--ipc``/``--mount`` (mpirun, an unshare prefix, ``-c``, ``-m``), it
  takes a Popen option other than env, stdout, stderr, text and cwd, or it asks for a
  stderr pipe of its own;
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
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from warm_zygote import HEADER

ZYGOTE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "warm_zygote.py")
#: Environment variables read while numpy, torch or tensorxfer import: a launch whose values
#: differ from a zygote's needs another zygote.
IMPORT_TIME_PREFIXES = ("PYTHON", "OMP_", "KMP_", "GOMP_", "MKL_", "OPENBLAS_", "TENSORXFER_", "TORCH", "PYTORCH_",
                        "LD_", "MALLOC_", "CUDA_")
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

    def __init__(self, args: List[str], pid: int, connection: socket.socket, stdout_fd: Optional[int],
                 text: bool) -> None:
        self.args = args
        self.pid = pid
        self.returncode: Optional[int] = None
        self.stdin = None
        self.stderr = None
        self.stdout = None if stdout_fd is None else open(stdout_fd, "r" if text else "rb")  # noqa: SIM115
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

    def communicate(self, input: Optional[str] = None, timeout: Optional[float] = None
                    ) -> Tuple[Union[str, bytes, None], None]:
        """Reads stdout to its end and waits; on ``timeout`` raises TimeoutExpired and keeps what was read."""
        assert input is None, "a warm process has no stdin"
        deadline = None if timeout is None else time.monotonic() + timeout
        if self.stdout is not None and not self.stdout.closed:
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
        if self.stdout is None:
            return None, None
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


#: nsenter's options for the namespaces a warm child can enter, and their /proc/PID/ns names.
NSENTER_NAMESPACES = {"--ipc": "ipc", "--net": "net", "--mount": "mnt"}


def _entered_namespaces(args: List[str]) -> Tuple[Optional[Dict], List[str]]:
    """``nsenter -t PID --net --ipc --mount -- command...`` (any of the three options) as
    (what to enter, command); any other command as (None, command)."""
    if len(args) > 4 and args[:2] == ["nsenter", "-t"] and args[2].isdigit() and "--" in args:
        end = args.index("--")
        options = args[3:end]
        if options and all(option in NSENTER_NAMESPACES for option in options):
            return {"pid": int(args[2]), "namespaces": [NSENTER_NAMESPACES[o] for o in options]}, args[end + 1:]
    return None, args


def _forkable(command: List[str], stdout, stderr) -> bool:
    return (len(command) >= 2 and command[0] == sys.executable and command[1].endswith(".py")
            and stdout in (subprocess.PIPE, None) and stderr in (subprocess.STDOUT, None)
            and not fresh_only())


def popen(args: Sequence[str], *, env: Optional[Dict[str, str]] = None, stdout=None, stderr=None,
          text: bool = False, cwd: Optional[str] = None, preload: Sequence[str] = (), **options: Any
          ) -> Union[subprocess.Popen, WarmProcess]:
    """``subprocess.Popen(args, env=env, stdout=stdout, stderr=stderr, text=text, cwd=cwd)``, forked
    from a warm zygote when the command is ``sys.executable script.py ...``, optionally behind
    ``nsenter -t PID`` with ``--net``, ``--ipc`` or ``--mount`` (the child enters those
    namespaces of PID; with ``--mount`` it starts in ``/``, as nsenter leaves it). Output: a
    pipe or, with None, this process's own stdout (fd 1); stderr into stdout or, with None,
    this process's fd 2. Any other Popen option (``start_new_session``, ``stdin``, ...) or a
    stderr pipe of its own starts a fresh interpreter."""
    args = [str(arg) for arg in args]
    enter, command = _entered_namespaces(args)
    if options or not _forkable(command, stdout, stderr):
        return subprocess.Popen(args, env=env, stdout=stdout, stderr=stderr, text=text, cwd=cwd, **options)
    environment = dict(os.environ if env is None else env)
    key = (_import_time_settings(environment), tuple(preload))
    address = _zygote_socket(key, environment)
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    connection.connect(address)
    read_end = write_end = None
    if stdout == subprocess.PIPE:
        read_end, write_end = os.pipe()
    out_fd = write_end if write_end is not None else 1  # None: inherited, as Popen leaves fds 1 and 2
    err_fd = out_fd if stderr == subprocess.STDOUT else 2
    if enter is not None and "mnt" in enter["namespaces"]:
        cwd = "/"
    with open(os.devnull, "rb") as devnull:
        body = json.dumps({"argv": command[1:], "env": environment, "cwd": cwd or os.getcwd(),
                           "enter": enter}).encode()
        socket.send_fds(connection, [HEADER.pack(len(body))], [devnull.fileno(), out_fd, err_fd])
        connection.sendall(body)
    if write_end is not None:
        os.close(write_end)
    reply = b""
    while b"\n" not in reply:
        chunk = connection.recv(4096)
        if not chunk:
            if read_end is not None:
                os.close(read_end)
            raise RuntimeError(f"the test zygote closed the connection before forking; its output: "
                               f"{_zygotes[key][2]}")
        reply += chunk
    line, rest = reply.split(b"\n", 1)
    process = WarmProcess(args, json.loads(line)["pid"], connection, read_end, text)
    process._replies = rest
    return process
