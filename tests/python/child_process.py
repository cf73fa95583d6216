"""Helpers for tests that run code where a crash or a hang must fail the test, not the run.

``run_child`` runs a snippet in a fresh interpreter that imports the same
tensorxfer as the tests (the installed package under scripts/test.sh, the
checkout with a developer build), so a SIGSEGV there is a return code.
``run_thread_ranks`` runs ``body`` on threads-as-ranks of one LocalGroup and
returns each rank's result or the exception it raised.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import uuid
from typing import Any, Callable, Dict, List


def child_environment() -> Dict[str, str]:
    """This process's environment, with its sys.path as the child's PYTHONPATH (the tests' tensorxfer)."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join(path for path in sys.path if path))


def run_child(code: str, timeout: float = 60.0) -> subprocess.CompletedProcess:
    """Runs ``code`` (dedented) with ``python -c``; returns the completed process."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=child_environment(),
                          capture_output=True, text=True, timeout=timeout)


def run_thread_ranks(world: int, body: Callable[[Any], Any], timeout: float = 60.0,
                     prefix: str = "ranks") -> List[Any]:
    """``body(group)`` on ``world`` threads joined as one LocalGroup; each result or exception.
    The group is closed after ``body``; a rank still running after ``timeout`` fails the test."""
    from tensorxfer.runtime import LocalGroup

    name = f"{prefix}-{uuid.uuid4().hex[:10]}"
    results: List[Any] = [None] * world

    def main(rank: int) -> None:
        group = LocalGroup.join(name, rank=rank, world_size=world, timeout=20)
        try:
            results[rank] = body(group)
        except BaseException as error:  # noqa: BLE001 - returned to the test
            results[rank] = error
        finally:
            group.close()

    threads = [threading.Thread(target=main, args=(rank,), daemon=True) for rank in range(world)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
    assert not any(thread.is_alive() for thread in threads), "a rank hung"
    return results
