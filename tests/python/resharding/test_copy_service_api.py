"""The copy-service API in one process: matching rules and messages, planning,
the native span copies, the factory and the service life cycle."""

from __future__ import annotations

import numpy as np
import pytest

from tensorxfer import _core
from tensorxfer.errors import ClosedError
from tensorxfer.resharding.copy_services import (
    CopyService,
    LocalCopyService,
    RecvOp,
    SendOp,
    TaskMismatchError,
    build_copy_service,
    match_local_ops_by_task_id,
)
from tensorxfer.resharding.copy_services import planning
from tensorxfer.resharding.copy_services.planning import matching, plan_cache
from tensorxfer.resharding.copy_services.planning.windows import assign_windows

# ---- match_local_ops_by_task_id: checks, order and exact messages (DESIGN.md) ----------


def sends(*ids):
    return [SendOp(task_id, None, 0) for task_id in ids]


def recvs(*ids):
    return [RecvOp(task_id, None, 0) for task_id in ids]


def test_match_pairs_in_receive_order():
    s = sends(1, 2, 3)
    r = recvs(3, 1, 2)
    pairs = match_local_ops_by_task_id(s, r, "B", 0)
    assert [(a.task_id, b.task_id) for a, b in pairs] == [(3, 3), (1, 1), (2, 2)]
    assert all(a is s[a.task_id - 1] for a, _ in pairs)


def test_match_none_task_id_is_checked_first():
    with pytest.raises(RuntimeError) as info:
        match_local_ops_by_task_id(sends(1, 2), recvs(None), "Backend", 3)  # counts differ too
    assert str(info.value) == "Backend: local (same-rank) transfer requires a task_id to match sends with recvs"
    with pytest.raises(RuntimeError, match="requires a task_id"):
        match_local_ops_by_task_id(sends(None), recvs(1), "Backend", 3)


def test_match_counts_and_duplicates():
    with pytest.raises(RuntimeError) as info:
        match_local_ops_by_task_id(sends(1, 2), recvs(1), "Backend", 3)
    assert str(info.value) == "Backend: unmatched local ops on rank 3: 2 local sends vs 1 local recvs"
    with pytest.raises(RuntimeError) as info:
        match_local_ops_by_task_id(sends(1, 1), recvs(1, 2), "Backend", 0)
    assert str(info.value) == "Backend: unmatched local ops on rank 0: 2 local sends vs 2 local recvs"
    with pytest.raises(RuntimeError, match="unmatched local ops on rank 0: 2 local sends vs 2 local recvs"):
        match_local_ops_by_task_id(sends(1, 2), recvs(1, 1), "Backend", 0)


def test_match_missing_send():
    with pytest.raises(RuntimeError) as info:
        match_local_ops_by_task_id(sends(1, 2), recvs(1, 7), "Backend", 5)
    assert str(info.value) == "Backend: missing local send for task_id=7 on rank 5"


def test_match_empty_is_empty():
    assert match_local_ops_by_task_id([], [], "B", 0) == []


# ---- planning -----------------------------------------------------------------------------


def table(task_ids, src, dst, nbytes):
    return matching.op_table(task_ids, [src] * len(task_ids), [dst] * len(task_ids), nbytes)


def test_windows_are_bounded_by_count_and_bytes():
    sizes = np.array([10] * 25 + [1000] * 5 + [10] * 3, np.int64)
    windows = assign_windows(sizes, max_count=8, max_bytes=2000)
    assert list(windows) == sorted(windows), "windows follow task order"
    for window in np.unique(windows):
        members = sizes[windows == window]
        assert len(members) <= 8
        assert members.sum() - members[-1] < 2000, "a window closes once a task starts past the byte bound"
    assert len(np.unique(windows)) >= 6


def test_plan_is_the_same_on_every_rank_and_pairs_messages():
    world = 3
    rng = np.random.default_rng(5)
    tables = []
    ops = {}
    for rank in range(world):
        send_ids, send_dst, send_n = [], [], []
        for peer in range(world):
            if peer == rank:
                continue
            for index in range(40):
                tid = (rank * world + peer) * 1000 + index
                ops[tid] = int(rng.choice([0, 8, 4096, 300_000]))
                send_ids.append(tid)
                send_dst.append(peer)
                send_n.append(ops[tid])
        tables.append([matching.op_table(send_ids, [rank] * len(send_ids), send_dst, send_n)])
    for rank in range(world):
        recv_ids = [tid for tid in ops if tid % 1000 < 40 and (tid // 1000) % world == rank]
        recv_src = [(tid // 1000) // world for tid in recv_ids]
        tables[rank].append(matching.op_table(recv_ids, recv_src, [rank] * len(recv_ids), [ops[t] for t in recv_ids]))
    plans = [planning.build_plan("B", rank, [tuple(t) for t in tables], [], 16, 1 << 20, 128 << 10)
             for rank in range(world)]
    # Every message a rank sends is received by its peer in the same window with the same tag and size.
    for rank, plan in enumerate(plans):
        assert len(plan.windows) >= 2
        for window in plan.windows:
            w = window.index
            for message in window.sends_packed:
                peer_window = next(x for x in plans[message.peer].windows if x.index == w)
                match = [m for m in peer_window.recvs_packed if m.peer == rank]
                assert len(match) == 1 and match[0].tag == message.tag and match[0].total == message.total
                assert all(n < (128 << 10) for n in message.nbytes)
            for message in window.sends_single:
                peer_window = next(x for x in plans[message.peer].windows if x.index == w)
                match = [m for m in peer_window.recvs_single if m.peer == rank and m.tag == message.tag]
                assert len(match) == 1 and match[0].nbytes == message.nbytes >= (128 << 10)


def test_plan_mismatches_name_the_task_and_both_sizes():
    s = table([1, 2], 0, 1, [8, 8])
    r = table([1, 2], 0, 1, [8, 16])
    empty = table([], 0, 0, [])
    with pytest.raises(TaskMismatchError) as info:
        planning.build_plan("B", 0, [(s, empty), (empty, r)], [], 16, 1 << 20, 1024)
    assert str(info.value) == "B: size mismatch for task_id=2: rank 0 sends 8 bytes, rank 1 receives 16 bytes"
    with pytest.raises(TaskMismatchError, match="missing recv for task_id=2: rank 0 sends 8 bytes to rank 1"):
        planning.build_plan("B", 0, [(s, empty), (empty, table([1], 0, 1, [8]))], [], 16, 1 << 20, 1024)
    with pytest.raises(TaskMismatchError, match="missing send for task_id=3: rank 1 receives 8 bytes from rank 0"):
        planning.build_plan("B", 0, [(s, empty), (empty, table([1, 2, 3], 0, 1, [8, 8, 8]))], [], 16, 1 << 20, 1024)
    with pytest.raises(TaskMismatchError, match="task_id=1 is sent twice"):
        planning.build_plan("B", 0, [(s, empty), (table([1], 1, 0, [8]), r)], [], 16, 1 << 20, 1024)
    with pytest.raises(TaskMismatchError, match="task_id=2: rank 0 sends it to rank 1, but rank 2 expects it"):
        r2 = np.concatenate([table([1], 0, 1, [8]), table([2], 0, 2, [8])])
        planning.build_plan("B", 0, [(s, empty), (empty, r2)], [], 16, 1 << 20, 1024)


def test_digest_changes_with_any_op():
    a = table([1, 2], 0, 1, [8, 8])
    b = table([1, 2], 0, 1, [8, 9])
    assert plan_cache.digest(a) != plan_cache.digest(b)
    assert plan_cache.digest(a) == plan_cache.digest(table([1, 2], 0, 1, [8, 8]))


def test_tables_round_trip_and_reject_bad_bytes():
    s, r = table([5, 6], 0, 1, [1, 2]), table([7], 1, 0, [3])
    s2, r2 = matching.decode_tables(matching.encode_tables(s, r))
    assert np.array_equal(s, s2) and np.array_equal(r, r2)
    with pytest.raises(ValueError, match="op tables"):
        matching.decode_tables(matching.encode_tables(s, r)[:-8])


# ---- native span copies --------------------------------------------------------------------


def test_pack_and_unpack_spans_round_trip():
    rng = np.random.default_rng(1)
    parts = [rng.integers(0, 255, size, dtype=np.uint8) for size in (0, 1, 4096, 70_000, 3)]
    addresses = np.array([p.ctypes.data for p in parts], np.uint64)
    nbytes = np.array([p.nbytes for p in parts], np.uint64)
    packed = np.zeros(int(nbytes.sum()) + 5, np.uint8)
    _core.pack_spans(packed, addresses, nbytes)
    assert np.array_equal(packed[: int(nbytes.sum())], np.concatenate(parts))
    outs = [np.zeros_like(p) for p in parts]
    _core.unpack_spans(packed, np.array([o.ctypes.data for o in outs], np.uint64), nbytes, _core.CopyEngine(2))
    for got, want in zip(outs, parts):
        assert np.array_equal(got, want)


def test_pack_spans_checks_capacity_and_shapes():
    part = np.ones(10, np.uint8)
    with pytest.raises(ValueError, match="dst holds 9 bytes, the 1 spans need 10"):
        _core.pack_spans(np.zeros(9, np.uint8), np.array([part.ctypes.data], np.uint64), np.array([10], np.uint64))
    with pytest.raises(ValueError, match="nbytes"):
        _core.pack_spans(np.zeros(20, np.uint8), np.array([part.ctypes.data], np.uint64), np.array([1, 2], np.uint64))


def test_copy_spans_rows_are_src_dst_nbytes():
    src = np.arange(1000, dtype=np.uint8)
    dst = np.zeros(1000, np.uint8)
    spans = np.array([[src.ctypes.data, dst.ctypes.data + 500, 100], [src.ctypes.data + 100, dst.ctypes.data, 7]],
                     np.uint64)
    _core.copy_spans(spans)
    assert np.array_equal(dst[500:600], src[:100]) and np.array_equal(dst[:7], src[100:107])
    assert not dst[7:500].any() and not dst[600:].any()
    with pytest.raises(ValueError, match=r"shape \(n, 3\)"):
        _core.copy_spans(np.zeros((2, 2), np.uint64))
    with pytest.raises(ValueError, match="overlap"):
        _core.copy_spans(np.array([[src.ctypes.data, src.ctypes.data + 4, 8]], np.uint64))


# ---- factory and life cycle --------------------------------------------------------------


def test_factory_names():
    service = build_copy_service("local")
    assert isinstance(service, LocalCopyService) and isinstance(service, CopyService)
    assert (service.rank, service.world_size) == (0, 1)
    with pytest.raises(ValueError, match=r"expected one of \['local', 'mpi', 'shm', 'torch'\], got 'nccl'"):
        build_copy_service("nccl")
    with pytest.raises(TypeError, match="backend"):
        build_copy_service(3)


def test_torch_backend_without_a_process_group_says_so():
    pytest.importorskip("torch")
    import torch.distributed as dist

    if dist.is_initialized():
        pytest.skip("a process group is initialized in this process")
    with pytest.raises(RuntimeError, match="init_process_group"):
        build_copy_service("torch")


def test_local_service_life_cycle():
    a = np.arange(6, dtype=np.int16)
    b = np.zeros(6, np.int16)
    with build_copy_service("local") as service:
        service.submit_send(a, 0, 1)
        service.submit_recv(b, 0, 1)
        a += 1  # local copies read the source at run(), after the caller's writes
        service.run()
        assert np.array_equal(b, np.arange(1, 7))
        assert service.send_ops == [] and service.recv_ops == []
        with pytest.raises(ValueError, match=r"dest_rank: expected a rank in \[0, 1\), got 1"):
            service.submit_send(a, 1, 2)
        assert service.send_ops == []
    assert service.closed
    for call in (lambda: service.submit_send(a, 0, 1), lambda: service.submit_recv(b, 0, 1), service.run):
        with pytest.raises(ClosedError, match="^LocalCopyService is closed$"):
            call()


def test_local_service_clears_the_queue_when_run_raises():
    service = LocalCopyService()
    service.submit_send(np.zeros(3, np.uint8), 0, 1)
    with pytest.raises(RuntimeError, match="unmatched local ops"):
        service.run()
    assert service.send_ops == [] and service.recv_ops == []
    out = np.zeros(3, np.uint8)
    service.submit_send(np.ones(3, np.uint8), 0, 2)
    service.submit_recv(out, 0, 2)
    service.run()
    assert out.tolist() == [1, 1, 1]


# ---- the reference's CopyService: three abstract methods, attributes set by the base --------


class ReferenceStyle(CopyService):
    """Written as the reference's own tests write one: the three methods, and an
    __init__ that never calls the base's."""

    def __init__(self):
        self.sent = []

    def submit_send(self, src_tensor, dest_rank, task_id=None):
        self.sent.append((task_id, dest_rank))

    def submit_recv(self, dest_tensor, src_rank, task_id=None):
        pass

    def run(self):
        self.sent.clear()


def test_a_subclass_written_against_the_reference_instantiates():
    assert CopyService.__abstractmethods__ == frozenset({"submit_send", "submit_recv", "run"})
    service = ReferenceStyle()
    service.submit_send(np.zeros(1), 0, 7)
    service.run()
    assert service.close() is None and service.close() is None  # the base close is a no-op
    assert (service.group, service.rank, service.world_size) == (None, 0, 1)
    assert service.requires_process_group_barrier is True  # upstream's default
    assert repr(service) == "ReferenceStyle(rank=0, world_size=1, 0 sends, 0 recvs queued)"


def test_the_base_init_sets_group_rank_and_world_size_from_the_group():
    class CallsBase(ReferenceStyle):
        def __init__(self, group=None):
            CopyService.__init__(self, group)

    class GroupLike:
        rank, world_size = 3, 5

    class CommLike:
        def Get_rank(self):
            return 2

        def Get_size(self):
            return 4

    group = GroupLike()
    service = CallsBase(group)
    assert (service.group, service.rank, service.world_size) == (group, 3, 5)
    assert (CallsBase(CommLike()).rank, CallsBase(CommLike()).world_size) == (2, 4)
    single = CallsBase()
    assert (single.group, single.rank, single.world_size, single.send_ops, single.recv_ops) == (None, 0, 1, [], [])


def test_each_backend_says_whether_run_needs_a_process_group_barrier():
    from tensorxfer.resharding.copy_services.mpi import MpiCopyService
    from tensorxfer.resharding.copy_services.shm import ShmCopyService
    from tensorxfer.resharding.copy_services.torch_distributed import TorchDistributedCopyService

    assert LocalCopyService.requires_process_group_barrier is False
    assert MpiCopyService.requires_process_group_barrier is False  # Testall: own sends and receives done
    assert ShmCopyService.requires_process_group_barrier is False  # ends with the executor's barrier
    assert TorchDistributedCopyService.requires_process_group_barrier is True  # nccl (gloo instances: False)
    local = LocalCopyService()
    assert (local.rank, local.world_size, local.group) == (0, 1, None)


# ---- matching (the C++ matcher on the copy services' keys), property-based -------------

from hypothesis import given, settings, strategies as st  # noqa: E402


@st.composite
def task_sets(draw):
    """Tasks (task id or None, src, dst, nbytes) among 3 ranks, ids unique."""
    ids = draw(st.lists(st.integers(-2**63, 2**63 - 1), unique=True, max_size=12))
    tasks = [(task_id, draw(st.integers(0, 2)), draw(st.integers(0, 2)), draw(st.integers(0, 64))) for task_id in ids]
    tasks += [(None, draw(st.integers(0, 2)), draw(st.integers(0, 2)), draw(st.integers(0, 64)))
              for _ in range(draw(st.integers(0, 4)))]
    return tasks


def tables_of(tasks, order):
    rows = [tasks[i] for i in order]
    ids = [task_id for task_id, _, _, _ in rows]
    sends = matching.op_table(ids, [s for _, s, _, _ in rows], [d for _, _, d, _ in rows], [n for *_, n in rows])
    return sends


@settings(max_examples=60, deadline=None)
@given(task_sets(), st.randoms())
def test_matching_pairs_every_key_in_key_order(tasks, random):
    send_order = list(range(len(tasks)))
    recv_order = list(range(len(tasks)))
    random.shuffle(recv_order)
    sends = tables_of(tasks, send_order)
    # Receives list the same tasks in another order; untagged ones keep their per-pair order.
    named = [i for i in recv_order if tasks[i][0] is not None] + [i for i in send_order if tasks[i][0] is None]
    recvs = tables_of(tasks, named)
    matched_sends, matched_recvs = matching.match("B", sends, recvs)
    key = slice(0, matching.KEY_B + 1)
    assert np.array_equal(matched_sends[:, key], matched_recvs[:, key])
    keys = [tuple(row) for row in matched_sends[:, key]]
    assert keys == sorted(keys) and len(keys) == len(tasks)
    assert sorted(matched_sends[:, matching.LOCAL_INDEX].tolist()) == list(range(len(tasks)))
    if len(tasks):
        dropped = random.randrange(len(tasks))
        with pytest.raises(TaskMismatchError, match="missing recv"):
            matching.match("B", sends, np.delete(recvs, dropped, axis=0))
