"""The native submit path of the copy services' queue (_core.SubmitSide, _queue.py).

A torch tensor submitted the common way is checked and described by one native
call; everything else takes the checked Python path. These tests pin that both
paths queue the same thing, that the description run() uses is always that of
the tensors it is handed, and the documented choice of when a tensor is read.
"""

from __future__ import annotations

import gc

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tensorxfer.errors import ClosedError
from tensorxfer.resharding.copy_services import SendOp, _tensors
from tensorxfer.resharding.copy_services._queue import SubmitQueue


def _plain(queue):
    """(task ids, tensors, ranks) of the sends and of the receives ``queue`` hands run()."""
    return tuple(tuple(columns[:3]) for columns in queue.take())


def _torch_queue():
    torch = pytest.importorskip("torch")
    queue = SubmitQueue("Recorder", 4)
    _tensors.normalize_fast(torch.zeros(1), "src_tensor", False, True, "B")  # the queue has met torch
    return torch, queue


def test_torch_submits_are_described_at_submit_as_describe_many_would():
    torch, queue = _torch_queue()
    base = torch.arange(64, dtype=torch.float32)
    tensors = [torch.zeros(4096, dtype=torch.uint8), base[3:9], base.view(8, 8).t(), torch.empty(0)]
    for index, tensor in enumerate(tensors):
        queue.submit_send(tensor, 1, index)
    array = np.zeros(5, np.uint8)
    queue.submit_send(array, 2, 99)  # a numpy array: through the buffer protocol
    queue.submit_send(np.zeros(3, "datetime64[s]"), 1, 101)  # a format the buffer protocol refuses
    queue.submit_send(torch.zeros(3, 3).to_sparse(), 3, 100)  # no data pointer: described (and raising) at run
    sends, _ = queue.take()
    assert sends.rows is not None and sends.rows[:, 2].tolist()[-2:] == [8, 8]  # undescribed
    native = _core_rows(tensors)
    assert sends.rows[:4].tolist() == native.tolist()
    assert sends.rows[4].tolist() == [array.ctypes.data, 5, 3]  # contiguous, on the host
    with pytest.raises(RuntimeError, match="data pointer"):
        sends.spans()  # what describing the sparse tensor raises, as before
    array = np.arange(3, dtype=np.int16)
    queue.submit_send(tensors[2], 1, 7)
    queue.submit_send(array, 1, 8)
    spans = queue.take()[0].spans()
    assert spans.nbytes.tolist() == [256, 6] and spans.contiguous.tolist() == [False, True]
    assert spans.address.tolist() == [tensors[2].data_ptr(), array.ctypes.data]


def _core_rows(tensors):
    from tensorxfer import _core

    return _core.describe_torch_tensors(tensors)


def test_keywords_and_odd_arguments_take_the_checked_path_with_its_messages():
    torch, queue = _torch_queue()
    t = torch.zeros(2)
    queue.submit_send(src_tensor=t, dest_rank=1, task_id=3)
    queue.submit_recv(t, src_rank=2)
    queue.submit_send(t, np.int64(1), np.int32(4))  # numpy integers: normalized to int
    with pytest.raises(TypeError, match="dest_tensor|src_tensor|argument"):
        queue.submit_send(t)
    with pytest.raises(ValueError, match=r"^dest_rank: expected a rank in \[0, 4\), got 4$"):
        queue.submit_send(t, 4, 1)
    with pytest.raises(ValueError, match=r"^task_id: expected a 64-bit signed integer"):
        queue.submit_send(t, 1, 2**63)
    with pytest.raises(ValueError, match=r"^src_tensor: Recorder moves host \(cpu\) tensors only, got one on meta$"):
        queue.submit_send(torch.zeros(1, device="meta"), 1, 5)
    sends, recvs = _plain(queue)
    assert sends == ([3, 4], [t, t], [1, 1]) and [type(v) for v in sends[0] + sends[2]] == [int] * 4
    assert recvs == ([None], [t], [2])
    queue.close()
    with pytest.raises(ClosedError, match=r"^Recorder is closed$"):
        queue.submit_send(t, 1, 1)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["submit", "append", "pop", "insert", "set", "edit", "clear"]),
                          st.integers(0, 5)), max_size=20))
def test_what_run_is_handed_describes_the_tensors_it_is_handed(steps):
    """Whatever a caller does to send_ops between submits, the description run() uses is
    that of the tensors run() gets (taken at submit where nothing changed them since)."""
    torch, queue = _torch_queue()
    base = torch.arange(96, dtype=torch.uint8)
    tensors = [torch.zeros(k + 1, dtype=torch.float32) for k in range(3)] + [base.view(8, 12).t(), base[5:9],
                                                                           np.arange(20.0).reshape(4, 5).T]
    view = queue.send_ops
    for action, index in steps:
        op = SendOp(index, tensors[index], 1)
        position = index % len(view) if len(view) else None
        if action == "submit":
            queue.submit_send(op.tensor, 1, index)
        elif action == "append":
            view.append(op)
        elif action == "insert":
            view.insert(index, op)
        elif action == "clear":
            view.clear()
        elif position is None:
            continue
        elif action == "pop":
            view.pop(position)
        elif action == "set":
            view[position] = op
        elif action == "edit":
            view[position].tensor = tensors[index]
    sends, _ = queue.take()
    expected = _tensors.describe_many(list(sends.tensors))
    got = sends.spans()
    assert got.address.tolist() == expected.address.tolist() and got.nbytes.tolist() == expected.nbytes.tolist()
    assert got.contiguous.tolist() == expected.contiguous.tolist() and got.host.tolist() == expected.host.tolist()


def test_a_tensor_is_read_when_run_starts_not_at_submit():
    """A tensor re-pointed or resized between its submit and run() is used as it is when run()
    starts: run() never touches memory the tensor has let go (read at submit, a re-pointed
    receive would land in the old storage, and a resized one in freed memory)."""
    torch = pytest.importorskip("torch")
    from tensorxfer.resharding.copy_services import LocalCopyService

    service = LocalCopyService()
    source, target = torch.zeros(16, dtype=torch.uint8), torch.zeros(16, dtype=torch.uint8)
    old = target.view(-1)  # holds the memory target has at submit
    service.submit_send(source, 0, 1)
    service.submit_recv(target, 0, 1)
    source.fill_(7)  # after the submit: sent
    elsewhere = torch.zeros(16, dtype=torch.uint8)
    target.set_(elsewhere.untyped_storage(), 0, (16,))  # re-pointed after the submit
    service.run()
    assert elsewhere.tolist() == [7] * 16 and old.tolist() == [0] * 16

    grown, small = torch.zeros(16, dtype=torch.uint8), torch.zeros(16, dtype=torch.uint8)
    service.submit_send(torch.full((64,), 5, dtype=torch.uint8), 0, 2)
    service.submit_recv(grown, 0, 2)
    grown.resize_(64)  # its storage moves: the 16 bytes it had may be freed
    service.run()
    assert grown.tolist() == [5] * 64
    service.submit_send(torch.full((16,), 3, dtype=torch.uint8), 0, 3)
    service.submit_recv(small, 0, 3)
    small.resize_(8)  # now 8 bytes: a size mismatch, refused as at any run
    with pytest.raises(RuntimeError, match="size|bytes"):
        service.run()


def test_the_native_path_holds_exactly_the_references_it_takes():
    """Submits keep each object alive until run() takes the ops; nothing leaks (a reference
    held too long or dropped too early would change these counts)."""
    import sys

    torch = pytest.importorskip("torch")
    tensor, task_id, rank = torch.zeros(4), 10**12 + 7, 1
    descriptors = [torch.Tensor.__dict__.get(name) or torch._C.TensorBase.__dict__[name]
                   for name in ("data_ptr", "nbytes", "is_contiguous", "is_cpu")]
    gc.collect()  # queues of earlier tests (a queue and its sides form a cycle)
    before = [sys.getrefcount(item) for item in [tensor, task_id, *descriptors]]
    alone = sys.getrefcount(tensor)
    for _ in range(50):
        queue = SubmitQueue("Recorder", 4)
        for _ in range(20):
            queue.submit_send(tensor, rank, task_id)  # native
            queue.submit_recv(tensor, rank, task_id=task_id)  # keywords: the checked path
        assert sys.getrefcount(tensor) == alone + 40
        sends, recvs = queue.take()
        assert len(sends.tensors) == len(recvs.tensors) == 20
        del sends, recvs
        with pytest.raises(ValueError):
            queue.submit_send(tensor, 9, task_id)
        queue.close()
        del queue
    gc.collect()
    assert [sys.getrefcount(item) for item in [tensor, task_id, *descriptors]] == before


def test_tensor_subclasses_are_described_natively_only_when_they_read_alike():
    """torch.nn.Parameter reads its address and size with torch.Tensor's own methods: described
    at submit. A subclass that overrides one of them is described at run, by its own method."""
    torch, queue = _torch_queue()

    class Overriding(torch.Tensor):
        def data_ptr(self):  # the same value, but its own method
            return super().data_ptr()

    weight = torch.nn.Parameter(torch.zeros(6))
    overriding = torch.zeros(3).as_subclass(Overriding)
    for _ in range(2):  # the second time through the subclass the side remembers
        queue.submit_send(weight, 1, 1)
        queue.submit_recv(overriding, 2, 2)
        queue.submit_recv(torch.zeros(2), 3, 3)
        sends, recvs = queue.take()
        assert sends.tensors == [weight] and sends.rows.tolist() == _core_rows([weight]).tolist()
        assert recvs.rows[:, 2].tolist()[0] == 8 and recvs.rows[1].tolist() == _core_rows([recvs.tensors[1]]).tolist()[0]
        spans = recvs.spans()
        assert spans.address.tolist()[0] == overriding.data_ptr() and spans.nbytes.tolist() == [12, 8]



@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["submit", "append", "insert", "set", "pop", "del_slice", "run"]),
                          st.booleans(), st.booleans(), st.integers(-8, 8)), max_size=30))
@example([("submit", True, True, 0), ("submit", False, True, 0), ("set", True, True, 0), ("set", False, True, 0)])
def test_run_moves_exactly_what_the_columns_say_whatever_was_edited(steps):
    """Submits and send_ops / recv_ops edits (set, insert, pop, slice delete) interleaved, with
    runs in between: every run copies each queued send into the receive the columns pair with
    it, and touches nothing an edit took out. Each op has its own tensor, numpy arrays (whose
    description is taken when they are queued) and torch tensors (read when run() starts)
    mixed, all of one size: a description left from before an edit points at another op's
    memory, and moves the wrong bytes or none."""
    torch = pytest.importorskip("torch")
    from tensorxfer.resharding.copy_services import LocalCopyService, RecvOp

    service = LocalCopyService()
    kept = []  # every tensor of earlier runs, alive so that no address is reused
    made = {SendOp: [], RecvOp: []}  # (fill, tensor) of every tensor made since the last run
    model = {SendOp: [], RecvOp: []}  # (task id, tensor) in queue order: a plain list's view
    task_ids = iter(range(1, 10**6))

    def new_op(op_type, numpy, task_id):
        fill = task_id % 250 + 1 if op_type is SendOp else 0
        tensor = np.full(16, fill, np.uint8) if numpy else torch.full((16,), fill, dtype=torch.uint8)
        made[op_type].append((fill, tensor))
        return op_type(task_id, tensor, 0)

    def run_and_check():
        pairs = {op_type: dict(model[op_type]) for op_type in model}
        for op_type, other in ((SendOp, RecvOp), (RecvOp, SendOp)):
            for task_id in pairs[other].keys() - pairs[op_type].keys():  # pair every queued op (appending)
                op = new_op(op_type, task_id % 2 == 0, task_id)
                (service.submit_send if op_type is SendOp else service.submit_recv)(op.tensor, 0, task_id)
                pairs[op_type][task_id] = op.tensor
        service.run()
        assert len(service.send_ops) == len(service.recv_ops) == 0
        expected = {id(tensor): task_id % 250 + 1 for task_id, tensor in pairs[RecvOp].items()}
        for fill, tensor in made[SendOp]:  # sources unchanged
            assert np.asarray(tensor).tolist() == [fill] * 16
        for _, tensor in made[RecvOp]:  # each queued receive holds its pair's bytes, the others none
            assert np.asarray(tensor).tolist() == [expected.get(id(tensor), 0)] * 16
        for op_type in model:
            kept.extend(made[op_type])
            made[op_type].clear()
            model[op_type].clear()

    for action, sending, numpy, index in steps:
        op_type = SendOp if sending else RecvOp
        ops = service.send_ops if sending else service.recv_ops
        listed = model[op_type]
        if action == "run":
            run_and_check()
            continue
        op = new_op(op_type, numpy, next(task_ids))
        if action == "submit":
            (service.submit_send if sending else service.submit_recv)(op.tensor, 0, op.task_id)
            listed.append((op.task_id, op.tensor))
        elif action == "append":
            ops.append(op)
            listed.append((op.task_id, op.tensor))
        elif action == "insert":
            ops.insert(index, op)
            listed.insert(index, (op.task_id, op.tensor))
        elif not listed:
            continue
        elif action == "set":
            ops[index % len(listed)] = op
            listed[index % len(listed)] = (op.task_id, op.tensor)
        elif action == "pop":
            ops.pop(index % len(listed))
            listed.pop(index % len(listed))
        elif action == "del_slice":
            del ops[index:index + 2]
            del listed[index:index + 2]
        queued = list(ops)
        assert [op.task_id for op in queued] == [task_id for task_id, _ in listed]
        assert all(op.tensor is tensor for op, (_, tensor) in zip(queued, listed))
    run_and_check()
