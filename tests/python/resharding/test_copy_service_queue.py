"""The submit queue of the batched copy services (mpi, shm, torch), in one process.

A submit keeps the ops as plain columns, the queue's only store; these tests
pin what the user sees: the documented SendOp / RecvOp lists (``send_ops`` /
``recv_ops``, a view of the columns), the same checks and messages as before,
and what ``run()`` is handed.
"""

from __future__ import annotations

import gc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tensorxfer.errors import ClosedError
from tensorxfer.resharding.copy_services import RecvOp, SendOp, _tensors
from tensorxfer.resharding.copy_services._queue import SubmitQueue
from tensorxfer.resharding.copy_services._service import QueuedCopyService


class RecordingRun:
    """A run that keeps the (task ids, tensors, ranks) of the sends and receives it was handed."""

    plans_built = 0

    def __init__(self) -> None:
        self.taken = None

    def run(self, take, timeout):
        self.taken = tuple(tuple(columns[:3]) for columns in take())

    def close(self) -> None:
        pass


class Recorder(QueuedCopyService):
    """A copy service over 4 ranks, whose run() returns the columns its queue handed the run."""

    backend_name = "Recorder"

    def __init__(self) -> None:
        super().__init__()
        self.world_size = 4
        self._compose(SubmitQueue(self.backend_name, self.world_size), RecordingRun())

    @property
    def host_only(self) -> bool:
        return self._queue.host_only

    @host_only.setter
    def host_only(self, value: bool) -> None:
        self._queue.host_only = value

    def run(self):  # type: ignore[override]
        """(task ids, tensors, ranks) of the sends and of the receives the queue hands run()."""
        super().run()
        return self._steps.taken


class Tagged(np.ndarray):
    """An ndarray subclass, as np.memmap or np.matrix are."""


def test_columns_hold_what_was_submitted_with_normalized_ints():
    queue = Recorder()
    a, b = np.arange(4, dtype=np.int16), np.zeros(3)
    tagged = np.zeros(5, np.uint8).view(Tagged)
    queue.submit_send(a, 1, 7)
    queue.submit_send(tagged, np.int32(2), np.int64(-5))
    queue.submit_send(b, 3)
    queue.submit_recv(tagged, np.int64(1), 9)
    sends, recvs = queue.run()
    assert sends[0] == [7, -5, None] and [type(t) for t in sends[0][:2]] == [int, int]
    assert sends[1][0] is a and sends[1][1] is tagged and sends[1][2] is b
    assert sends[2] == [1, 2, 3] and all(type(r) is int for r in sends[2])
    assert recvs == ([9], [tagged], [1])
    assert queue.run() == (([], [], []), ([], [], []))


def test_ndarray_subclasses_are_accepted_not_recursed_on():
    tagged = np.zeros(5, np.uint8).view(Tagged)
    assert _tensors.normalize_fast(tagged, "src_tensor", True, True, "B") is tagged
    masked = np.ma.zeros(4)
    assert _tensors.normalize_fast(masked, "dest_tensor", True, True, "B") is masked
    readonly = np.zeros(4).view(Tagged)
    readonly.flags.writeable = False
    with pytest.raises(ValueError, match="dest_tensor: expected a writable array"):
        _tensors.normalize_fast(readonly, "dest_tensor", True, True, "B")


def test_send_ops_and_recv_ops_are_the_documented_lists():
    queue = Recorder()
    a, b, c = np.zeros(2), np.ones(3), np.full(4, 2.0)
    queue.submit_send(a, 1, 10)
    queue.submit_recv(b, 2, 11)
    view = queue.send_ops
    assert view == [SendOp(10, a, 1)] and type(view[0]) is SendOp
    assert queue.recv_ops == [RecvOp(11, b, 2)] and type(queue.recv_ops[0]) is RecvOp
    queue.submit_send(c, 3, None)  # lands in the list already handed out, as a SendOp
    assert queue.send_ops is view and view[-1] == SendOp(None, c, 3) and type(view[-1]) is SendOp
    view[0].tensor = c  # an op read from it is a value: changing it queues nothing
    assert view[0] == SendOp(10, a, 1)
    view[0] = SendOp(10, b, 1)  # what the user writes there is what run() gets
    view.pop()
    queue.recv_ops.clear()
    sends, recvs = queue.run()
    assert sends[0] == [10] and sends[1][0] is b and sends[2] == [1]
    assert recvs == ([], [], [])
    assert queue.send_ops == [] and queue.recv_ops == []
    queue.send_ops = [SendOp(5, a, 2)]  # an assigned list is the queue too
    queue.submit_send(b, 1, 6)
    assert queue.run()[0] == ([5, 6], [a, b], [2, 1])


@pytest.mark.parametrize("inspected", [False, True], ids=["not-read", "after-reading-send_ops"])
def test_bad_arguments_raise_the_same_errors_and_queue_nothing(inspected):
    queue = Recorder()
    if inspected:
        assert queue.send_ops == [] and queue.recv_ops == []
    ok = np.zeros(4)
    readonly = np.zeros(4)
    readonly.flags.writeable = False
    cases = [
        (lambda: queue.submit_send(ok, 4, 1), ValueError, r"^dest_rank: expected a rank in \[0, 4\), got 4$"),
        (lambda: queue.submit_recv(ok, -1, 1), ValueError, r"^src_rank: expected a rank in \[0, 4\), got -1$"),
        (lambda: queue.submit_send(ok, True, 1), TypeError, r"^dest_rank: expected an integer rank, got bool$"),
        (lambda: queue.submit_send(ok, 1.0, 1), TypeError, r"^dest_rank: expected an integer rank, got float$"),
        (lambda: queue.submit_send(ok, 0, "x"), TypeError, r"^task_id: expected an integer or None, got str$"),
        (lambda: queue.submit_recv(ok, 0, False), TypeError, r"^task_id: expected an integer or None, got bool$"),
        (lambda: queue.submit_send(ok, 0, 2**63), ValueError, r"^task_id: expected a 64-bit signed integer"),
        (lambda: queue.submit_send(None, 0, 1), TypeError,
         r"^src_tensor: expected a numpy array, torch tensor, buffer or DLPack object, got NoneType$"),
        (lambda: queue.submit_recv([1, 2], 0, 1), TypeError, r"^dest_tensor: expected a numpy array, torch tensor"),
        (lambda: queue.submit_recv(readonly, 0, 1), ValueError, r"^dest_tensor: expected a writable array"),
        (lambda: queue.submit_send(np.array([None]), 0, 1), TypeError, r"^src_tensor: arrays of Python objects"),
        # The tensor is checked first, then the rank, then the task id.
        (lambda: queue.submit_send(None, 9, "x"), TypeError, r"^src_tensor"),
        (lambda: queue.submit_recv(ok, 9, "x"), ValueError, r"^src_rank"),
    ]
    for call, error, pattern in cases:
        with pytest.raises(error, match=pattern):
            call()
    assert queue.send_ops == [] and queue.recv_ops == []
    assert queue.run() == (([], [], []), ([], [], []))


def test_torch_tensors_off_the_host_are_refused_by_host_only_backends():
    torch = pytest.importorskip("torch")
    queue = Recorder()
    cpu = torch.zeros(3)
    queue.submit_send(cpu, 1, 1)
    queue.submit_recv(torch.zeros(2, 2).t(), 1, 2)  # any layout
    with pytest.raises(ValueError, match=r"^src_tensor: Recorder moves host \(cpu\) tensors only, got one on meta$"):
        queue.submit_send(torch.zeros(3, device="meta"), 1, 3)
    with pytest.raises(ValueError, match="dest_tensor: Recorder moves host"):
        queue.submit_recv(torch.zeros(3, device="meta"), 1, 4)
    sends, recvs = queue.run()
    assert sends[0] == [1] and sends[1][0] is cpu and recvs[0] == [2]
    queue.host_only = False  # as the torch backend: any device
    meta = torch.zeros(3, device="meta")
    queue.submit_send(meta, 1, 5)
    assert queue.run()[0][1] == [meta]


def test_a_closed_queue_refuses_submits():
    queue = Recorder()
    queue.submit_send(np.zeros(1), 1, 1)
    queue.close()
    assert queue.send_ops == [] and queue.recv_ops == []
    with pytest.raises(ClosedError, match=r"^Recorder is closed$"):
        queue.submit_send(np.zeros(1), 1, 1)
    with pytest.raises(ClosedError, match=r"^Recorder is closed$"):
        queue.submit_recv(np.zeros(1), 1, 1)
    assert queue.send_ops == [] and queue.recv_ops == []


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_submits_allocate_nothing_the_garbage_collector_tracks(kind):
    """A step of 10,000 ops must not feed the collector (a full collection costs
    tens of ms with torch imported): the columns hold ints and the caller's tensors
    (numpy arrays take the checked path, torch tensors the native one)."""
    if kind == "torch":
        torch = pytest.importorskip("torch")
        tensors = [torch.zeros(8, dtype=torch.uint8) for _ in range(2000)]
    else:
        tensors = [np.zeros(8, np.uint8) for _ in range(2000)]
    queue = Recorder()
    gc.collect()
    gc.disable()
    try:
        before = gc.get_count()[0]
        for index, tensor in enumerate(tensors):
            queue.submit_send(tensor, 1, 1000 + index)
            queue.submit_recv(tensor, 2, 5000 + index)
        allocated = gc.get_count()[0] - before
    finally:
        gc.enable()
    assert allocated < 100, f"4000 submits allocated {allocated} tracked objects"
    sends, recvs = queue.run()
    assert len(sends[0]) == len(recvs[0]) == 2000


def test_torch_tensors_are_described_as_the_native_describe_spans_does(monkeypatch):
    torch = pytest.importorskip("torch")
    from tensorxfer import _core

    base = torch.arange(64, dtype=torch.float32)
    tensors = [torch.zeros(4096, dtype=torch.uint8), base[3:9], base.view(8, 8).t(), base.view(8, 8)[:, 2],
               torch.empty(0, dtype=torch.int64), torch.zeros(3, dtype=torch.complex64), torch.zeros(2, device="meta")]
    _tensors.normalize_fast(tensors[0], "src_tensor", False, True, "B")  # the queue has met torch
    rows = _core.describe_spans(tensors)
    calls = []
    with monkeypatch.context() as patch:  # plain torch tensors only: described by their own methods
        patch.setattr(_core, "describe_spans", lambda objects: calls.append(objects))
        spans = _tensors.describe_many(tensors)
    assert calls == []
    assert spans.address.tolist() == rows[:, 0].tolist()
    assert spans.nbytes.tolist() == rows[:, 1].astype(np.int64).tolist() == [4096, 24, 256, 32, 0, 24, 8]
    assert spans.contiguous.tolist() == ((rows[:, 2] & 1) != 0).tolist() == [True, True, False, False, True, True, True]
    assert spans.host.tolist() == ((rows[:, 2] & 2) != 0).tolist() == [True] * 6 + [False]
    mixed = _tensors.describe_many([tensors[1], np.zeros(5, np.uint8)])  # not all torch: the native path
    assert mixed.nbytes.tolist() == [24, 5]


def test_repr_counts_the_queue_without_turning_it_into_dataclasses():
    queue = Recorder()
    queue.submit_send(np.zeros(1), 1, 1)
    queue.submit_recv(np.zeros(1), 2, 2)
    queue.submit_recv(np.zeros(1), 3, 3)
    assert repr(queue) == "Recorder(rank=0, world_size=4, 1 sends, 2 recvs queued)"
    empty = np.zeros(0)
    gc.collect()
    gc.disable()
    try:
        before = gc.get_count()[0]
        for index in range(200):
            queue.submit_send(empty, 1, 10 + index)
        allocated = gc.get_count()[0] - before
    finally:
        gc.enable()
    assert allocated < 50  # columns: no SendOp per submit
    assert len(queue.send_ops) == 201 and repr(queue) == "Recorder(rank=0, world_size=4, 201 sends, 2 recvs queued)"
    queue.close()
    assert repr(queue) == "Recorder(rank=0, world_size=4, closed)"


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["submit", "append", "pop", "insert", "set", "edit", "del_slice", "clear",
                                           "assign"]),
                          st.integers(0, 6), st.integers(0, 3), st.integers(-5, 50)), max_size=25))
def test_send_ops_behaves_as_the_list_it_documents(steps):
    """Whatever a caller does to send_ops (list operations, submits in between), run() executes
    exactly what a plain list of SendOp would hold; an op read from it is a copy (the columns
    are the queue's only store), so changing one changes nothing queued."""
    queue = Recorder()
    tensors = [np.full(3, k, np.uint8) for k in range(7)]
    model: list = []
    for action, index, rank, task_id in steps:
        view = queue.send_ops
        op = SendOp(task_id, tensors[index], rank)
        position = index % len(model) if model else None
        if action == "submit":
            queue.submit_send(op.tensor, rank, task_id)
            model.append(SendOp(task_id, op.tensor, rank))
        elif action == "append":
            view.append(op)
            model.append(op)
        elif action == "insert":
            view.insert(index, op)
            model.insert(index, op)
        elif action == "clear":
            view.clear()
            model.clear()
        elif action == "assign":
            queue.send_ops = [op, SendOp(task_id + 1, tensors[0], 1)]
            model = [op, SendOp(task_id + 1, tensors[0], 1)]
        elif position is None:
            continue
        elif action == "pop":
            assert view.pop(position) == model.pop(position)
        elif action == "set":
            view[position] = op
            model[position] = op
        elif action == "edit":  # an op read from the list is a value: changing it queues nothing
            read = view[position]
            read.tensor = tensors[index]
            read.dest_rank = rank
        elif action == "del_slice":
            del view[position:position + 2]
            del model[position:position + 2]
        assert queue.send_ops == model and len(queue.send_ops) == len(model)
    sends, _ = queue.run()
    assert sends[0] == [op.task_id for op in model] and sends[2] == [op.dest_rank for op in model]
    assert all(a is op.tensor for a, op in zip(sends[1], model)) and len(sends[1]) == len(model)
    assert queue.send_ops == []


def test_native_torch_description_raises_what_the_tensor_raises():
    torch = pytest.importorskip("torch")
    from tensorxfer import _core

    with pytest.raises(RuntimeError, match="data pointer"):  # a sparse tensor has no storage
        _core.describe_torch_tensors([torch.zeros(2), torch.zeros(3, 3).to_sparse()])
    with pytest.raises(AttributeError, match="data_ptr"):
        _core.describe_torch_tensors([object()])
    rows = _core.describe_torch_tensors([torch.zeros(2, 2).t()])
    assert rows[:, 1].tolist() == [16] and rows[:, 2].tolist() == [2]  # on the host, not contiguous

