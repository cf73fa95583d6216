"""The threads that run a plan's network jobs across hosts (``_network_run._Threads``).

A rank once aborted at exit ("terminate called without an active exception", CI run of
the mixed 2x2 cluster test): a daemon thread still held a finished job, and the job's
gloo Work was freed while the interpreter shut down. These tests hold the contract that
prevents it: a job's objects are gone by the time the job counts as finished, and
``close`` leaves no thread alive.
"""

from __future__ import annotations

import gc
import queue
import weakref

from tensorxfer.resharding.copy_services._network_run import _Threads


class _Request:
    """Stands for a job's engine request (a gloo Work)."""


def _job_holding(request: _Request):
    def body(_deadline):
        assert request is not None
    return body


def test_a_finished_jobs_objects_are_freed_before_it_counts_as_finished():
    threads = _Threads(2)
    events: "queue.Queue" = queue.Queue()
    requests = [_Request() for _ in range(4)]
    alive = [weakref.ref(request) for request in requests]
    for k, request in enumerate(requests):
        threads.start(("job", k), _job_holding(request), None, events)
    del request
    requests.clear()
    assert sorted(events.get(timeout=5)[:2] for _ in range(4)) == [(("job", k), "done") for k in range(4)]
    assert threads.join(5)
    gc.collect()
    assert [ref() for ref in alive] == [None] * 4, "a thread still holds a finished job"
    threads.close()


def test_close_joins_every_idle_thread():
    threads = _Threads(3)
    events: "queue.Queue" = queue.Queue()
    for k in range(3):
        threads.start(k, lambda _deadline: None, None, events)
    assert threads.join(5)
    workers = list(threads._threads)
    assert len(workers) == 3 and all(worker.is_alive() for worker in workers)
    threads.close(timeout=5)
    assert not any(worker.is_alive() for worker in workers)


def test_a_failed_job_is_reported_with_its_error():
    threads = _Threads(1)
    events: "queue.Queue" = queue.Queue()

    def fails(_deadline):
        raise ValueError("the job's own error")

    threads.start("bad", fails, None, events)
    key, outcome, detail = events.get(timeout=5)
    assert (key, outcome, str(detail)) == ("bad", "failed", "the job's own error")
    threads.close(timeout=5)
