"""Unified memory in child processes (spawn and fork): allocator state per process, pools after fork."""

from __future__ import annotations

import multiprocessing

import numpy as np
import pytest

from tensorxfer import _core
from tensorxfer.inference import unified_memory as um

pytestmark = pytest.mark.multiprocess


def child_report(queue) -> None:
    """Runs in the child: its own allocator setup, and a prefetch on fresh pool memory."""
    from tensorxfer._tensor import as_view
    from tensorxfer.inference import unified_memory as child_um

    state_before = child_um._compilation_state.name
    state = child_um.compile_allocator().name
    with child_um.create_host_mempool() as pool:
        array = pool.empty(32 * _core.page_size(), np.uint8)
        child_um.prefetch_managed_tensor(array, device=-1)
        resident = _core.resident_page_count(as_view(array, "array"), "array")
    queue.put((state_before, state, child_um._compilation_error, resident))


def run_child(method: str):
    context = multiprocessing.get_context(method)
    queue = context.Queue()
    process = context.Process(target=child_report, args=(queue,))
    process.start()
    try:
        return queue.get(timeout=60)
    finally:
        process.join(timeout=30)
        assert process.exitcode == 0


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_child_process_sets_up_and_prefetches(method):
    parent_state = um.compile_allocator()
    state_before, state, error, resident = run_child(method)
    # A forked child inherits the parent's recorded state; a spawned one starts from scratch.
    assert state_before == (parent_state.name if method == "fork" else "UNATTEMPTED")
    assert state == parent_state.name
    assert error == um._compilation_error
    assert resident == 32


def test_pool_arrays_stay_private_to_the_parent_after_fork():
    context = multiprocessing.get_context("fork")
    with um.create_host_mempool() as pool:
        array = pool.zeros(4 * _core.page_size(), np.uint8)
        array[:] = 1

        def child() -> None:
            array[:] = 2  # copy-on-write: the parent's pages keep their values
            extra = pool.empty(_core.page_size(), np.uint8)
            extra[:] = 3

        process = context.Process(target=child)
        process.start()
        process.join(timeout=30)
        assert process.exitcode == 0
        assert (array == 1).all()
        assert pool.stats()["live_blocks"] == 1
