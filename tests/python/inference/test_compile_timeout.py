"""The allocator setup's timeout (``_compile_timeout``): the caller gets
``UnifiedMemoryCompileTimeoutError`` at the deadline, the work is never
interrupted (no exception injected into ``import`` or CUDA initialisation), it
finishes on its own and records its outcome, and the process stays healthy."""

from __future__ import annotations

import importlib
import sys
import textwrap
import threading
import time

import pytest
from unified_memory_helpers import reset_compile_state

from tensorxfer import _core
from tensorxfer.inference import unified_memory as um


@pytest.fixture
def fresh_compile_state(monkeypatch):
    """Run a test against UNATTEMPTED module state; the real state is restored afterwards."""
    reset_compile_state(monkeypatch)
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:False")
    return monkeypatch


@pytest.fixture
def slow_module(tmp_path, monkeypatch):
    """The name of a module whose import takes 0.6 s and ends by setting ``COMPLETE = True``."""
    name = f"tensorxfer_slow_import_{time.monotonic_ns()}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent("""
        import time
        STARTED = True
        time.sleep(0.6)
        COMPLETE = True
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


# ---- _compile_timeout ------------------------------------------------------------------------
def test_nothing_is_injected_into_a_slow_import_in_the_block(slow_module):
    with um._compile_timeout(0.1):
        module = importlib.import_module(slow_module)  # outlives the timeout, must not be interrupted
    assert module.COMPLETE is True
    assert sys.modules[slow_module] is module


def test_a_slow_import_run_under_the_timeout_raises_and_still_completes(slow_module):
    late = []
    landed = threading.Event()

    def on_late(result, error):
        late.append((result, error))
        landed.set()

    start = time.monotonic()
    with pytest.raises(um.UnifiedMemoryCompileTimeoutError, match=r"timed out after 0.1 s"):
        with um._compile_timeout(0.1) as run:
            run(lambda: importlib.import_module(slow_module), on_late=on_late)
    assert time.monotonic() - start < 0.5, "the caller must get the error at the deadline, not when the work ends"
    assert landed.wait(timeout=10)
    (module, error), = late
    assert error is None and module.COMPLETE is True
    assert sys.modules[slow_module] is module, "the import finished whole: no half-imported module"
    assert importlib.import_module(slow_module) is module


def test_work_that_finishes_in_time_returns_its_result_and_leaves_nothing_behind():
    late = []
    with um._compile_timeout(5) as run:
        assert run(lambda: 42, on_late=lambda *outcome: late.append(outcome)) == 42
    run.worker.join(timeout=5)
    assert not run.worker.is_alive() and late == []


def test_errors_of_the_work_and_of_the_block_pass_through():
    with pytest.raises(KeyError, match="inner"):
        with um._compile_timeout(5) as run:
            run(lambda: {}["inner"])
    with pytest.raises(KeyError):
        with um._compile_timeout(5):
            raise KeyError("block")


def test_runs_share_the_deadline_of_the_block():
    with pytest.raises(um.UnifiedMemoryCompileTimeoutError):
        with um._compile_timeout(0.3) as run:
            run(lambda: time.sleep(0.2))
            run(lambda: time.sleep(0.2))  # 0.4 s in all: past the block's deadline


@pytest.mark.parametrize("bad", [0, -1, True, "5", None])
def test_compile_timeout_validates_seconds(bad):
    with pytest.raises((TypeError, ValueError), match="timeout_s"):
        with um._compile_timeout(bad):
            pass


# ---- compile_allocator with a setup slower than the timeout ---------------------------------
def blocked_load(release: threading.Event, outcome):
    def load():
        assert release.wait(timeout=30)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    return load


def test_a_timed_out_setup_fails_now_and_records_its_real_outcome_later(fresh_compile_state):
    release = threading.Event()
    loaded = (object(), _core, _core.__file__)
    fresh_compile_state.setattr(um, "_load_allocator", blocked_load(release, loaded))
    fresh_compile_state.setattr(um, "_COMPILE_TIMEOUT_S", 0.2)
    start = time.monotonic()
    assert um.compile_allocator() is um.CompilationState.FAILURE
    assert time.monotonic() - start < 5
    assert "timed out after 0.2 s" in um._compilation_error
    with pytest.raises(um.UnifiedMemoryCompileTimeoutError, match="timed out after 0.2 s"):
        um.create_unified_mempool()
    assert um.compile_allocator() is um.CompilationState.FAILURE  # once per process: no second setup
    worker = um._background_compile
    assert worker is not None and worker.is_alive(), "the setup must go on, not be killed"
    release.set()
    worker.join(timeout=10)
    assert not worker.is_alive()
    assert um.compile_allocator() is um.CompilationState.SUCCESS
    assert (um._alloc, um._mod, um._so_path) == loaded and um._compilation_error is None
    assert not um._compilation_timed_out


def test_a_timed_out_setup_that_then_fails_records_why(fresh_compile_state):
    release = threading.Event()
    fresh_compile_state.setattr(um, "_load_allocator", blocked_load(release, OSError("driver went away")))
    fresh_compile_state.setattr(um, "_COMPILE_TIMEOUT_S", 0.1)
    assert um.compile_allocator() is um.CompilationState.FAILURE
    release.set()
    um._background_compile.join(timeout=10)
    assert um._compilation_state is um.CompilationState.FAILURE
    assert um._compilation_error == "driver went away"
    with pytest.raises(um.UnifiedMemoryUnsupportedError, match="driver went away") as info:
        um.create_unified_mempool()
    assert not isinstance(info.value, um.UnifiedMemoryCompileTimeoutError)


def test_the_process_stays_healthy_after_a_timeout(fresh_compile_state, slow_module):
    fresh_compile_state.setattr(um, "_load_allocator", lambda: importlib.import_module(slow_module) and None)
    fresh_compile_state.setattr(um, "_COMPILE_TIMEOUT_S", 0.1)
    assert um.compile_allocator() is um.CompilationState.FAILURE
    um._background_compile.join(timeout=10)
    assert sys.modules[slow_module].COMPLETE is True
    # A lock held by the setup would hang these; later work in other threads runs normally.
    assert um._compile_lock.acquire(timeout=5)
    um._compile_lock.release()
    done = []
    thread = threading.Thread(target=lambda: done.append(um.compile_allocator()))
    thread.start()
    thread.join(timeout=5)
    assert done == [um.CompilationState.FAILURE]
