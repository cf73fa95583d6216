"""OpThread, the order the backend's ops run in: one at a time, in submission order.

Synchronous ops run on the caller's thread when nothing is queued or running
(``run_now``), async ones on the op thread or inline in ``Work.wait``;
``on_idle`` runs when a queued op leaves the queue empty (the backend puts its
spinning waits back there, so an op run on the caller's thread sets nothing).
Threads only: OpThread is a Python object of one process.
"""

from __future__ import annotations

import threading
import time

import pytest
from hypothesis import given, settings, strategies as st

from conftest import torch_or_skip

torch = torch_or_skip()

from tensorxfer.distributed.work import CompletedWork, OpThread, Work  # noqa: E402


def _keep(error_name: str, error: BaseException) -> BaseException:
    return error


class _Recorder:
    """Ops that log their start and end, and fail if two ever overlap."""

    def __init__(self) -> None:
        self.log: list = []
        self.idle_calls: list = []
        self._inside = 0
        self._guard = threading.Lock()

    def op(self, name, pause_s: float = 0.0):
        def run() -> None:
            with self._guard:
                self._inside += 1
                overlapping = self._inside > 1
            self.log.append(name)
            if pause_s:
                time.sleep(pause_s)
            with self._guard:
                self._inside -= 1
            assert not overlapping, f"op {name} ran while another op ran"
        return run

    def on_idle(self) -> None:
        self.idle_calls.append(len(self.log))


def _submit(ops: OpThread, name, run) -> Work:
    def body(work: Work) -> None:
        run()
        work.finish()
    return ops.submit(str(name), [name], body)


def _completed_within(work: Work, seconds: float) -> bool:
    """Whether ``work`` counts as completed within ``seconds`` (polled: is_completed never blocks)."""
    deadline = time.monotonic() + seconds
    while not work.is_completed() and time.monotonic() < deadline:
        time.sleep(0.001)
    return work.is_completed()


def _sync(ops: OpThread, name, run):
    """What the process group does for async_op=False: run here, else queue and wait."""
    done = ops.run_now(str(name), [name], run)
    if done is None:
        done = _submit(ops, name, run)
    done.wait()
    return done


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.sampled_from([0.0, 0.0, 0.001])), min_size=1, max_size=25))
def test_ops_run_one_at_a_time_in_submission_order(plan):
    recorder = _Recorder()
    ops = OpThread("test-ops", _keep, on_idle=recorder.on_idle)
    try:
        works = []
        for index, (synchronous, pause_s) in enumerate(plan):
            run = recorder.op(index, pause_s)
            works.append(_sync(ops, index, run) if synchronous else _submit(ops, index, run))
        for index, work in enumerate(works):
            assert work.wait() is True
            assert work.get_future().wait() == [index]
    finally:
        assert ops.stop(10.0)
    assert recorder.log == list(range(len(plan)))


def test_run_now_runs_on_the_caller_only_when_nothing_is_queued_or_running():
    recorder = _Recorder()
    ops = OpThread("test-ops", _keep, on_idle=recorder.on_idle)
    try:
        callers = []
        done = ops.run_now("first", ["first"], lambda: callers.append(threading.get_ident()))
        assert isinstance(done, CompletedWork) and done.result() == ["first"]
        assert callers == [threading.get_ident()]
        release = threading.Event()
        queued = _submit(ops, "slow", release.wait)  # the op thread runs it and blocks
        deadline = time.monotonic() + 10
        while ops.queued and time.monotonic() < deadline:
            time.sleep(0.001)
        assert ops.run_now("second", ["second"], lambda: callers.append("ran")) is None  # running: queue it
        release.set()
        queued.wait()
        assert callers == [threading.get_ident()]
    finally:
        assert ops.stop(10.0)


def test_on_idle_runs_when_a_queued_op_leaves_the_queue_empty_and_never_for_run_now():
    recorder = _Recorder()
    ops = OpThread("test-ops", _keep, on_idle=recorder.on_idle)
    try:
        _sync(ops, 0, recorder.op(0))  # on the caller: no on_idle
        assert recorder.idle_calls == []
        release = threading.Event()
        first = _submit(ops, 1, lambda: (release.wait(), recorder.log.append(1)))
        second = _submit(ops, 2, recorder.op(2))
        release.set()
        second.wait()
        first.wait()
        deadline = time.monotonic() + 10
        while not recorder.idle_calls and time.monotonic() < deadline:
            time.sleep(0.001)
        # Not after op 1 (op 2 was queued), once after op 2 (before the op's turn ended).
        assert recorder.idle_calls == [3]
        _sync(ops, 3, recorder.op(3))
        assert recorder.idle_calls == [3]
    finally:
        assert ops.stop(10.0)


def test_threads_submitting_at_once_never_overlap_and_keep_each_ones_order():
    recorder = _Recorder()
    ops = OpThread("test-ops", _keep, on_idle=recorder.on_idle)
    errors: list = []

    def caller(thread_index: int) -> None:
        try:
            works = []
            for step in range(200):
                name = (thread_index, step)
                run = recorder.op(name)
                works.append(_sync(ops, name, run) if step % 3 else _submit(ops, name, run))
            for work in works:
                work.wait()
        except BaseException as error:  # noqa: BLE001
            errors.append(error)

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(4)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    finally:
        assert ops.stop(10.0)
    assert not errors, errors
    assert len(recorder.log) == 800
    for thread_index in range(4):
        assert [step for t, step in recorder.log if t == thread_index] == list(range(200))


def test_a_failure_fails_every_later_op_without_running_it():
    recorder = _Recorder()
    ops = OpThread("test-ops", _keep, on_idle=recorder.on_idle)
    try:
        def boom() -> None:
            raise ValueError("boom")

        failed = ops.run_now("boom", [], boom)
        with pytest.raises(ValueError, match="boom"):
            failed.wait()
        later = ops.run_now("later", [], recorder.op("later"))
        with pytest.raises(ValueError, match="boom"):
            later.wait()
        queued = _submit(ops, "queued", recorder.op("queued"))
        with pytest.raises(ValueError, match="boom"):
            queued.wait()
        assert recorder.log == []
    finally:
        assert ops.stop(10.0)


def test_an_op_queued_behind_one_running_on_a_caller_runs_without_anyone_waiting_for_it():
    # The op thread finds the turn taken and sleeps; the caller that ends its turn must wake it.
    ops = OpThread("test-ops", _keep)
    try:
        release, started = threading.Event(), threading.Event()
        caller = threading.Thread(target=ops.run_now, args=("held", [], lambda: (started.set(), release.wait())))
        caller.start()
        assert started.wait(10)
        ran = threading.Event()
        queued = _submit(ops, "queued", ran.set)
        time.sleep(0.05)  # the op thread has looked at the turn and gone to sleep
        assert not ran.is_set()
        release.set()
        caller.join(10)
        assert ran.wait(10), "the queued op never ran"
        assert _completed_within(queued, 10)
    finally:
        assert ops.stop(10.0)


def test_an_on_idle_that_raises_leaves_the_op_thread_running():
    def broken() -> None:
        raise RuntimeError("on_idle failed")

    ops = OpThread("test-ops", _keep, on_idle=broken)
    try:
        for step in range(3):  # each leaves the queue empty: on_idle runs (and raises) each time
            ran = threading.Event()
            _submit(ops, step, ran.set)
            assert ran.wait(10), f"op {step} never ran: the op thread died"
    finally:
        assert ops.stop(10.0)


@pytest.mark.parametrize("waiter", ["op thread", "caller"])
def test_a_future_callback_may_start_an_op_and_wait_for_it(waiter):
    """A then() callback runs on the thread that ran the op, after its turn; one that submits another
    op and waits for that op's future (PowerSGD's DDP comm hook does) must not wait for its own
    thread. Before, the callback ran on the op thread inside the op's turn: this waited forever."""
    ops = OpThread("test-ops", _keep)
    try:
        go = threading.Event()
        first = _submit(ops, 1, lambda: go.wait(10.0))
        chained = first.get_future().then(lambda done: _submit(ops, 2, lambda: None).get_future().wait())
        go.set()
        if waiter == "caller":  # the caller runs the op inline when it is next (Work.wait)
            first.wait()
        result: list = []
        watcher = threading.Thread(target=lambda: result.append(chained.wait()), daemon=True)
        watcher.start()
        watcher.join(10.0)
        assert result == [[2]], "the op the callback started never ran"
        # The first work counts as done once its future's callbacks have returned (as gloo's does),
        # which is just after `chained` completed, on the op thread: wait for it, boundedly.
        assert _completed_within(first, 10)
    finally:
        assert ops.stop(10.0)


def test_a_work_completes_after_its_futures_callbacks_return():
    """The order the test above relies on, pinned: a then() callback still sees its work running,
    and the work is done once the callbacks have returned. (That test once asserted completion the
    moment the chained future's waiter woke, before the op thread had left the callbacks: it failed
    1 run in 10 of the fast tier with a CPU-bound process beside it.)"""
    ops = OpThread("test-ops", _keep)
    try:
        go = threading.Event()  # the op ends only after its callback is registered
        first = _submit(ops, 1, lambda: go.wait(10.0))
        seen: list = []
        left_callback = threading.Event()

        def callback(done):
            seen.append(first.is_completed())
            time.sleep(0.05)  # a waiter woken by a chained future would run meanwhile
            left_callback.set()
            return done.value()

        chained = first.get_future().then(callback)
        go.set()
        assert chained.wait() == [1]
        assert left_callback.wait(10)
        assert seen == [False], "the work counted as done before its future's callbacks ran"
        first.wait()
        assert first.is_completed()
    finally:
        assert ops.stop(10.0)
