"""The learner's relay host: one helper process that forks a process per admitted session.

The helper (``python -m tensorxfer.ipc.remote.relay_host_main``) imports torch once and then
only reads commands and forks, so each session's relay starts in milliseconds and
shares the helper's pages until it writes them.  A relay that dies (gloo aborts a
process on a message longer than its posted receive; see :mod:`.relay`) takes no
other session and not the learner with it.

Pipes (JSON lines):
  learner -> helper stdin   ``{"start": n, "spec": {...}}`` forks session n's relay;
                            ``{"close": n}`` or ``{"close": "all"}`` tells relays the learner
                            closes; EOF after ``{"close": "all"}``: the helper exits once its
                            relays have (killing those left after 2 * ``timeout``); EOF
                            without it (the learner died): the relays are killed at once, so
                            their producers see the link break, and the helper exits.
  relays, helper -> stdout  the relays' events (:class:`.relay.Events`) and the helper's own
                            ``{"session": n, "event": "exit", "status": s}`` when it reaps
                            relay n (s: exit code, or minus the signal number).
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Dict, IO, Optional

from tensorxfer.ipc.remote.relay import Events, Relay, listen_for_close

_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


# ---- the helper process -------------------------------------------------------------------------


def _die_with_parent() -> None:
    """The kernel kills this process when the helper exits (prctl PR_SET_PDEATHSIG, SIGKILL): a relay
    never outlives the host that watches it (the helper is single-threaded, so its one thread is it)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _write(line: Dict[str, Any]) -> None:
    try:
        os.write(1, json.dumps(line).encode() + b"\n")
    except OSError:
        pass  # the learner is gone


def _relay_child(spec: Dict[str, Any], control_fd: int, helper: int) -> None:
    """Body of a forked relay process: never returns."""
    status = 0
    _die_with_parent()
    if os.getppid() != helper:  # the helper died before the line above
        os._exit(1)
    try:
        relay = Relay(spec, Events(1, spec["session"]))
        threading.Thread(target=listen_for_close, args=(relay, control_fd), daemon=True).start()
        relay.run()
    except BaseException:  # noqa: BLE001 - the exit status tells the learner
        status = 1
    finally:
        os._exit(status)


def serve_forever() -> None:
    """The helper's loop: fork a relay per start command, pass closes on, reap and report exits."""
    # Imported once here, before any fork: every relay shares them.
    import torch.distributed  # noqa: F401
    import tensorxfer._core  # noqa: F401
    import tensorxfer.ipc.slot_ring  # noqa: F401

    children: Dict[int, int] = {}  # pid -> session
    controls: Dict[int, int] = {}  # session -> write end of its control pipe
    grace = 30.0
    buffered = b""
    closing_since: Optional[float] = None
    asked_to_close = False
    helper = os.getpid()
    _write({"session": 0, "event": "ready"})

    def close(target: Any) -> None:
        for session in list(controls) if target == "all" else [target]:
            fd = controls.pop(session, -1)
            if fd >= 0:
                try:
                    os.write(fd, b"c")
                except OSError:
                    pass
                os.close(fd)

    while children or closing_since is None:
        if closing_since is None:
            ready, _, _ = select.select([0], [], [], 0.05)
            if ready:
                chunk = os.read(0, 65536)
                if not chunk:
                    closing_since = time.monotonic()
                    if asked_to_close:  # the learner closes: its relays say so to their producers
                        close("all")
                    else:  # the learner died: its relays go at once, so their producers see the link break
                        for pid in children:
                            os.kill(pid, signal.SIGKILL)
                buffered += chunk
                while b"\n" in buffered:
                    line, buffered = buffered.split(b"\n", 1)
                    command = json.loads(line)
                    if "start" in command:
                        session, spec = int(command["start"]), command["spec"]
                        grace = float(spec["timeout"])
                        read_end, write_end = os.pipe()
                        pid = os.fork()
                        if pid == 0:
                            os.close(write_end)
                            for fd in controls.values():
                                os.close(fd)
                            os.close(0)
                            _relay_child(spec, read_end, helper)
                        os.close(read_end)
                        children[pid] = session
                        controls[session] = write_end
                    elif "close" in command:
                        asked_to_close = asked_to_close or command["close"] == "all"
                        close(command["close"])
        else:
            time.sleep(0.05)
            if time.monotonic() - closing_since > 2 * grace:
                for pid in children:
                    os.kill(pid, signal.SIGKILL)
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            session = children.pop(pid, -1)
            if session < 0:
                continue
            fd = controls.pop(session, -1)
            if fd >= 0:
                os.close(fd)
            _write({"session": session, "event": "exit", "status": os.waitstatus_to_exitcode(status)})


# ---- the learner's side -----------------------------------------------------------------------


class RelayHost:
    """Starts the helper and hands each event it reports to ``on_event(event_dict)`` on a thread of
    its own; ``on_event({"event": "host-exit", ...})`` once when the helper's stdout closes."""

    def __init__(self, on_event: Callable[[Dict[str, Any]], None]) -> None:
        self.on_event = on_event
        self.lock = threading.Lock()
        environment = dict(os.environ)
        # The helper imports this package from where the learner did (an installed package, or a
        # source tree on PYTHONPATH).
        environment["PYTHONPATH"] = os.pathsep.join(
            [_PACKAGE_ROOT] + ([environment["PYTHONPATH"]] if environment.get("PYTHONPATH") else []))
        self.process = subprocess.Popen([sys.executable, "-m", "tensorxfer.ipc.remote.relay_host_main"],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=environment,
                                        start_new_session=True)
        self.ready = threading.Event()
        self.reader = threading.Thread(target=self._read, name="tensorxfer-relay-host", daemon=True)
        self.reader.start()

    def _read(self) -> None:
        stdout: IO[bytes] = self.process.stdout  # type: ignore[assignment]
        for line in stdout:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if event.get("event") == "ready":
                self.ready.set()
                continue
            self.on_event(event)
        stdout.close()
        self.ready.set()
        self.on_event({"session": 0, "event": "host-exit", "status": self.process.wait()})

    def command(self, **command: Any) -> bool:
        """Sends one command; False when the helper is gone."""
        line = json.dumps(command).encode() + b"\n"
        with self.lock:
            try:
                stdin: IO[bytes] = self.process.stdin  # type: ignore[assignment]
                stdin.write(line)
                stdin.flush()
                return True
            except (OSError, ValueError):
                return False

    def close(self, timeout: float) -> None:
        """Closes every relay (they tell their producers) and waits for the helper to leave."""
        self.command(close="all")
        with self.lock:
            try:
                self.process.stdin.close()  # type: ignore[union-attr]
            except OSError:
                pass
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self.reader.join(5.0)

