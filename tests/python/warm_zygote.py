"""The zygote of warm_launcher.py: imports once, then forks one child per launch request.

Run as ``python warm_zygote.py LISTEN_FD [MODULE ...]``: LISTEN_FD is a listening AF_UNIX
socket inherited from the test process. The zygote imports numpy, torch,
torch.distributed, tensorxfer and every MODULE (warnings silenced, as the workers do),
then serves requests, one per connection:

- request: a length-prefixed JSON object ``{"argv": [script, arg, ...], "env": {...},
  "cwd": path, "enter": null or {"pid": n, "namespaces": ["net", "ipc", "mnt"]}}`` with
  three file descriptors (the child's stdin, stdout, stderr);
- reply: ``{"pid": n}`` once the child is forked, then ``{"status": wait status}`` when it
  has exited (the zygote reaps it), then the connection closes.

The child closes the zygote's descriptors, takes the three it was sent as 0, 1 and 2, enters
the namespaces asked for (setns, as nsenter), takes the request's environment, working
directory and argv, puts the script's folder first on
``sys.path`` and runs the script as ``__main__``; it then leaves through the interpreter's
normal exit (SystemExit, an uncaught exception's traceback and exit status 1, atexit handlers,
finalizers), as ``python script.py`` would. The zygote exits when its parent does.
"""

from __future__ import annotations

import ctypes
import importlib
import json
import os
import runpy
import selectors
import socket
import struct
import sys
import warnings

PRELOADED = ("numpy", "torch", "torch.distributed", "tensorxfer")
#: The length prefix of a request (warm_launcher.py frames its requests with it).
HEADER = struct.Struct("!I")


def _receive_request(connection: socket.socket) -> tuple:
    header, fds, _, _ = socket.recv_fds(connection, HEADER.size, 3)
    if len(header) != HEADER.size:
        for fd in fds:
            os.close(fd)
        raise ConnectionError("short request header")
    (length,) = HEADER.unpack(header)
    body = b""
    while len(body) < length:
        chunk = connection.recv(length - len(body))
        if not chunk:
            raise ConnectionError("short request body")
        body += chunk
    return json.loads(body), fds


def _send(connection: socket.socket, message: dict) -> None:
    try:
        connection.sendall(json.dumps(message).encode() + b"\n")
    except OSError:  # the test process stopped listening: nothing to tell
        pass


def _enter(pid: int, namespace: str) -> None:
    """setns() into ``namespace`` of ``pid``, as nsenter does (a mount namespace also moves the
    root and the working directory to its root)."""
    fd = os.open(f"/proc/{pid}/ns/{namespace}", os.O_RDONLY | os.O_CLOEXEC)
    try:
        if ctypes.CDLL(None, use_errno=True).setns(fd, 0) != 0:
            error = ctypes.get_errno()
            raise OSError(error, f"setns into the {namespace} namespace of pid {pid}: {os.strerror(error)}")
    finally:
        os.close(fd)


def _become_the_script(request: dict, fds: list, selector: selectors.BaseSelector, zygote_sockets: list,
                       pidfds: set) -> None:
    """In the forked child: never returns; leaves through SystemExit or an exception."""
    for zygote_socket in zygote_sockets:  # close(), not the garbage collector: nothing is closed twice
        zygote_socket.close()
    selector.close()
    for fd in pidfds:
        os.close(fd)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in set(fds):
        if fd > 2:
            os.close(fd)
    for namespace in ("ipc", "net", "mnt") if request.get("enter") else ():  # nsenter's order
        if namespace in request["enter"]["namespaces"]:
            _enter(request["enter"]["pid"], namespace)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv = list(request["argv"])
    script = os.path.abspath(sys.argv[0])
    sys.path[0] = os.path.dirname(script)
    runpy.run_path(script, run_name="__main__")
    sys.exit(0)


def serve(listener: socket.socket) -> None:
    parent = os.getppid()
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, None)
    sockets = [listener]  # what a child must close: the zygote's sockets, the other children's pidfds
    pidfds = set()
    while os.getppid() == parent:
        for key, _ in selector.select(timeout=1.0):
            if key.data is None:
                connection, _ = listener.accept()
                try:
                    request, fds = _receive_request(connection)
                except (ConnectionError, ValueError):
                    connection.close()
                    continue
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    _become_the_script(request, fds, selector, [*sockets, connection], pidfds)
                for fd in fds:
                    os.close(fd)
                _send(connection, {"pid": pid})
                exited = os.pidfd_open(pid)
                sockets.append(connection)
                pidfds.add(exited)
                selector.register(exited, selectors.EVENT_READ, (pid, connection))
            else:
                pid, connection = key.data
                _, status = os.waitpid(pid, 0)
                selector.unregister(key.fd)
                sockets.remove(connection)
                pidfds.discard(key.fd)
                os.close(key.fd)
                _send(connection, {"status": status})
                connection.close()


def main() -> None:
    listener = socket.socket(fileno=int(sys.argv[1]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # megatron-core warns about missing Transformer Engine at import
        for module in (*PRELOADED, *sys.argv[2:]):
            importlib.import_module(module)
    serve(listener)


if __name__ == "__main__":
    main()
