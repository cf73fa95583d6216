"""Helpers for tests that run code where a crash or a hang must fail the test, not the run.

``run_child`` runs a snippet in a fresh interpreter that imports the same
tensorxfer as the tests (the installed package under scripts/test.sh, the
checkout with a developer build), so a SIGSEGV there is a return code.
``on_threads`` runs ``fn(rank)`` on a thread per rank and returns each rank's
result or the exception it raised (``first_error_raised`` turns that into a
raise); ``run_thread_ranks`` runs ``body`` on threads-as-ranks of one LocalGroup.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import uuid
from typing import Any, Callable, Dict, List, Optional


def child_environment() -> Dict[str, str]:
    """This process's environment, with its sys.path as the child's PYTHONPATH (the tests' tensorxfer)."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join(path for path in sys.path if path))


def run_child(code: str, timeout: float = 60.0) -> subprocess.CompletedProcess:
    """Runs ``code`` (dedented) with ``python -c``; returns the completed process."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=child_environment(),
                          capture_output=True, text=True, timeout=timeout)


def on_threads(world: int, fn: Callable[[int], Any], timeout: Optional[float] = None) -> List[Any]:
    """``fn(rank)`` on ``world`` threads; each rank's result or the exception it raised.
    A rank still running after ``timeout`` (None: no limit) fails the test."""
    results: List[Any] = [None] * world

    def main(rank: int) -> None:
        try:
            results[rank] = fn(rank)
        except BaseException as error:  # noqa: BLE001 - returned to the test
            results[rank] = error

    threads = [threading.Thread(target=main, args=(rank,), daemon=True) for rank in range(world)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
    assert not any(thread.is_alive() for thread in threads), "a rank hung"
    return results


def first_error_raised(results: List[Any]) -> List[Any]:
    """``results`` of :func:`on_threads`, after raising the first rank's exception if any."""
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results


def run_thread_ranks(world: int, body: Callable[[Any], Any], timeout: float = 60.0,
                     prefix: str = "ranks") -> List[Any]:
    """``body(group)`` on ``world`` threads joined as one LocalGroup; each result or exception.
    The group is closed after ``body``; a rank still running after ``timeout`` fails the test."""
    from tensorxfer.runtime import LocalGroup

    name = f"{prefix}-{uuid.uuid4().hex[:10]}"

    def main(rank: int) -> Any:
        group = LocalGroup.join(name, rank=rank, world_size=world, timeout=20)
        try:
            return body(group)
        finally:
            group.close()

    return on_threads(world, main, timeout)
