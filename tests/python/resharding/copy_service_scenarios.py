"""Conformance scenarios every copy-service backend must pass (run on every rank).

Each scenario is ``fn(service, rank, world, size) -> None`` and raises
AssertionError on failure; ``size`` is "short" (the default CI run) or "slow".
The scenarios are collective: every rank of the group runs the same list in
the same order. They are run by copy_service_worker.py inside real process
groups and checked by test_copy_service_conformance.py.
"""

from __future__ import annotations

import re
from typing import Callable, Dict, List

import numpy as np
import torch

from tensorxfer.resharding.copy_services import RecvOp, SendOp, TaskMismatchError

SCENARIOS: Dict[str, Callable] = {}


def scenario(fn: Callable) -> Callable:
    SCENARIOS[fn.__name__] = fn
    return fn


def task_id(src: int, dst: int, index: int, world: int, base: int = 0) -> int:
    """A task id unique per (src, dst, index), known to both ends."""
    return base + (src * world + dst) * 1_000_000 + index


def pattern(tid: int, nbytes: int) -> np.ndarray:
    """The bytes the sender of task tid sends (depends on tid only)."""
    return ((np.arange(nbytes, dtype=np.int64) * 7 + tid * 13) % 251).astype(np.uint8)


def exchange(service, rank: int, world: int, sizes: List[int], base: int, make_src=None, make_dst=None,
             peers=None) -> List:
    """Every rank sends len(sizes) tasks to each peer; returns [(dst, expected bytes)]."""
    peers = range(world) if peers is None else peers
    expected = []
    for peer in peers:
        for index, nbytes in enumerate(sizes):
            out_id = task_id(rank, peer, index, world, base)
            src = pattern(out_id, nbytes)
            service.submit_send(make_src(src) if make_src else src, peer, out_id)
            in_id = task_id(peer, rank, index, world, base)
            dst = make_dst(nbytes) if make_dst else np.zeros(nbytes, np.uint8)
            service.submit_recv(dst, peer, in_id)
            expected.append((dst, pattern(in_id, nbytes), in_id))
    return expected


def as_bytes(tensor) -> np.ndarray:
    if isinstance(tensor, torch.Tensor):
        return tensor.contiguous().reshape(-1).view(torch.uint8).numpy()
    return np.ascontiguousarray(tensor).reshape(-1).view(np.uint8)


def check(expected) -> None:
    for dst, want, tid in expected:
        got = as_bytes(dst)
        assert got.shape == want.shape and np.array_equal(got, want), f"task {tid}: wrong bytes received"


def expect_error(fn: Callable, error_type, *patterns: str) -> str:
    try:
        fn()
    except error_type as error:
        text = str(error)
        for wanted in patterns:
            assert re.search(wanted, text), f"error {text!r} lacks {wanted!r}"
        return text
    raise AssertionError(f"expected {error_type.__name__} matching {patterns}, nothing was raised")


# ---- data movement ---------------------------------------------------------------

@scenario
def all_to_all_mixed_sizes(service, rank, world, size):
    sizes = [1, 100, 4096, 65536, 200_000, 1 << 20, 3]
    expected = exchange(service, rank, world, sizes, base=1)
    service.run()
    assert not service.send_ops and not service.recv_ops, "run() must clear its queue"
    check(expected)


@scenario
def all_to_all_checked_after_run(service, rank, world, size):
    expected = exchange(service, rank, world, [4096] * 50 + [300_000] * 3, base=2)
    service.run()
    check(expected)


@scenario
def self_sends_only(service, rank, world, size):
    expected = exchange(service, rank, world, [8, 0, 1 << 20, 12345], base=3, peers=[rank])
    service.run()
    check(expected)


@scenario
def zero_byte_and_odd_sizes(service, rank, world, size):
    expected = exchange(service, rank, world, [0, 1, 3, 7, 0, 4097, 131071, 131072, 131073, 0], base=4)
    service.run()
    check(expected)


@scenario
def empty_batch(service, rank, world, size):
    service.run()


@scenario
def many_small_tensors(service, rank, world, size):
    total = 10_000 if size == "slow" else 1_000
    per_peer = max(1, total // max(1, world))
    expected = exchange(service, rank, world, [4096 if i % 3 else 64 for i in range(per_peer)], base=5)
    service.run()
    check(expected)


@scenario
def large_tensors(service, rank, world, size):
    nbytes = (64 << 20) if size == "slow" else (3 << 20) + 5
    count = 3 if size == "slow" else 2
    peers = [(rank + 1) % world]  # a ring keeps the memory bounded with 4 ranks
    src_peer = (rank - 1) % world
    expected = []
    for index in range(count):
        out_id = task_id(rank, peers[0], index, world, 6_000_000_000)
        service.submit_send(pattern(out_id, nbytes), peers[0], out_id)
        in_id = task_id(src_peer, rank, index, world, 6_000_000_000)
        dst = np.zeros(nbytes, np.uint8)
        service.submit_recv(dst, src_peer, in_id)
        expected.append((dst, pattern(in_id, nbytes), in_id))
    service.run()
    check(expected)


DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.int16, torch.int32,
          torch.int64, torch.uint8, torch.bool, torch.complex64]
NUMPY_DTYPES = [np.float16, np.float32, np.float64, np.int8, np.uint16, np.int32, np.uint64, np.bool_, np.complex128]


@scenario
def every_dtype_torch_and_numpy(service, rank, world, size):
    expected = []
    for peer in range(world):
        for index, dtype in enumerate(DTYPES):
            out_id = task_id(rank, peer, index, world, 7_000_000_000)
            in_id = task_id(peer, rank, index, world, 7_000_000_000)
            element = torch.empty((), dtype=dtype).element_size()
            count = 257
            src = torch.from_numpy(pattern(out_id, count * element)).view(dtype)
            service.submit_send(src, peer, out_id)
            dst = torch.zeros(count, dtype=dtype)
            service.submit_recv(dst, peer, in_id)
            expected.append((dst, pattern(in_id, count * element), in_id))
        for index, dtype in enumerate(NUMPY_DTYPES):
            out_id = task_id(rank, peer, 100 + index, world, 7_000_000_000)
            in_id = task_id(peer, rank, 100 + index, world, 7_000_000_000)
            element = np.dtype(dtype).itemsize
            src = pattern(out_id, 33 * element).view(dtype).reshape(3, 11)
            service.submit_send(src, peer, out_id)
            # Received into a torch tensor of another dtype but the same byte size.
            dst = torch.zeros(33 * element, dtype=torch.uint8).view(torch.int8)
            service.submit_recv(dst, peer, in_id)
            expected.append((dst, pattern(in_id, 33 * element), in_id))
    service.run()
    check(expected)


@scenario
def non_contiguous_destinations_and_sources(service, rank, world, size):
    expected = []
    for peer in range(world):
        for index, rows in enumerate([4, 64, 4096]):  # small (packed) and large (single) tasks
            out_id = task_id(rank, peer, index, world, 8_000_000_000)
            in_id = task_id(peer, rank, index, world, 8_000_000_000)
            nbytes = rows * 8 * 4
            base = torch.from_numpy(pattern(out_id, nbytes).copy()).view(torch.float32).view(rows, 8)
            src = base.t().contiguous().t()  # same values, column-major: not contiguous
            assert not src.is_contiguous()
            service.submit_send(src, peer, out_id)
            big = torch.full((rows, 16), -1.0)
            dst = big[:, ::2]  # every other column: not contiguous
            service.submit_recv(dst, peer, in_id)
            expected.append((dst, pattern(in_id, nbytes), in_id))
            expected.append((big[:, 1::2], np.full(rows * 8, -1.0, np.float32).view(np.uint8), in_id))
        out_id = task_id(rank, peer, 10, world, 8_000_000_000)
        in_id = task_id(peer, rank, 10, world, 8_000_000_000)
        holder = np.zeros((50, 6), np.int32)
        dst = holder.T  # numpy, transposed: not C-contiguous
        service.submit_send(pattern(out_id, 50 * 6 * 4).view(np.int32).reshape(6, 50), peer, out_id)
        service.submit_recv(dst, peer, in_id)
        expected.append((dst, pattern(in_id, 50 * 6 * 4), in_id))
    service.run()
    check(expected)


@scenario
def repeated_runs_reuse_the_plan(service, rank, world, size):
    """Same ids and sizes: new tensors (runs 1, 2), then the same tensors again with new contents (3, 4)."""
    built = None
    kept = {}
    for repeat in range(4):
        expected = []
        for peer in range(world):
            for index in range(20):
                out_id = task_id(rank, peer, index, world, 9_000_000_000)
                in_id = task_id(peer, rank, index, world, 9_000_000_000)
                src = pattern(out_id + repeat, 1000 + index)  # new contents, same sizes
                if repeat >= 2:  # the tensors of run 2, written again
                    kept[peer, index][0][:] = src
                    kept[peer, index][1][:] = 0
                else:
                    kept[peer, index] = (src, np.zeros(1000 + index, np.uint8))
                src, dst = kept[peer, index]
                service.submit_send(src, peer, out_id)
                service.submit_recv(dst, peer, in_id)
                expected.append((dst, pattern(in_id + repeat, 1000 + index), in_id))
        service.run()
        check(expected)
        if repeat == 0:
            built = getattr(service, "plans_built", None)
    if built is not None:
        assert service.plans_built == built, f"runs 2 and 3 built {service.plans_built - built} new plans"


@scenario
def untagged_remote_ops_match_in_order(service, rank, world, size):
    if world == 1:
        return
    expected = []
    for peer in range(world):
        if peer == rank:
            continue
        for index in range(5):
            nbytes = 10 + index * 100_000
            service.submit_send(pattern(rank * 100 + peer * 10 + index, nbytes), peer)
            dst = np.zeros(nbytes, np.uint8)
            service.submit_recv(dst, peer)
            expected.append((dst, pattern(peer * 100 + rank * 10 + index, nbytes), index))
    service.run()
    check(expected)


class _TaggedArray(np.ndarray):
    """An ndarray subclass (as np.memmap is): moved like any ndarray."""


@scenario
def ndarray_subclasses_and_numpy_integer_arguments(service, rank, world, size):
    expected = []
    for peer in range(world):
        for index, nbytes in enumerate([24, 200_000]):  # packed and single
            out_id = task_id(rank, peer, index, world, 12_000_000_000)
            in_id = task_id(peer, rank, index, world, 12_000_000_000)
            service.submit_send(pattern(out_id, nbytes).view(_TaggedArray), np.int32(peer), np.int64(out_id))
            dst = np.zeros(nbytes, np.uint8).view(_TaggedArray)
            service.submit_recv(dst, np.int64(peer), np.uint64(in_id))
            expected.append((dst, pattern(in_id, nbytes), in_id))
    service.run()
    check(expected)


@scenario
def queued_ops_read_before_run(service, rank, world, size):
    """send_ops / recv_ops read mid-step are SendOp / RecvOp lists; later submits land in them."""
    first = exchange(service, rank, world, [16, 300_000], base=13_000_000_000)
    sends, recvs = service.send_ops, service.recv_ops
    assert all(type(op) is SendOp for op in sends) and all(type(op) is RecvOp for op in recvs)
    assert [op.dest_rank for op in sends] == [peer for peer in range(world) for _ in range(2)]
    assert [op.task_id for op in recvs] == [tid for _, _, tid in first]
    assert all(op.tensor is dst for op, (dst, _, _) in zip(recvs, first))
    second = exchange(service, rank, world, [40], base=14_000_000_000)
    assert service.send_ops is sends and len(sends) == 3 * world and type(sends[-1]) is SendOp
    assert service.recv_ops is recvs and recvs[-1].tensor is second[-1][0]
    service.run()
    check(first + second)
    assert not service.send_ops and not service.recv_ops


# ---- errors ----------------------------------------------------------------------

@scenario
def size_mismatch_raises_on_both_ranks(service, rank, world, size):
    if world == 1:
        return
    tid = 424242
    if rank == 0:
        service.submit_send(np.zeros(8, np.uint8), 1, tid)
    if rank == 1:
        service.submit_recv(np.zeros(16, np.uint8), 0, tid)
    expect_error(service.run, TaskMismatchError, "task_id=424242", r"\b8 bytes", r"\b16 bytes")
    assert not service.send_ops and not service.recv_ops


@scenario
def missing_recv_raises_naming_the_task(service, rank, world, size):
    if world == 1:
        return
    if rank == 0:
        service.submit_send(np.zeros(8, np.uint8), world - 1, 515151)
    expect_error(service.run, TaskMismatchError, "missing recv", "task_id=515151")


@scenario
def missing_send_raises_naming_the_task(service, rank, world, size):
    if world == 1:
        return
    if rank == world - 1:
        service.submit_recv(np.zeros(8, np.uint8), 0, 616161)
    expect_error(service.run, TaskMismatchError, "missing send", "task_id=616161")


@scenario
def local_size_mismatch(service, rank, world, size):
    service.submit_send(np.zeros(4, np.uint8), rank, 77)
    service.submit_recv(np.zeros(5, np.uint8), rank, 77)
    expect_error(service.run, TaskMismatchError, "task_id=77", r"\b4 bytes", r"\b5 bytes")


@scenario
def same_task_ids_with_new_sizes_are_checked_every_run(service, rank, world, size):
    """A repeated pattern (same ids and ranks) reuses what it can, but sizes are checked anew."""
    base = 15_000_000_000
    previous = (rank - 1) % world

    def submit(sizes, local_extra=0, remote_extra=0):
        """exchange(), with task 0 from this rank / from the previous rank received into
        a destination larger by local_extra / remote_extra bytes."""
        expected = []
        for peer in range(world):
            for index, nbytes in enumerate(sizes):
                out_id, in_id = task_id(rank, peer, index, world, base), task_id(peer, rank, index, world, base)
                service.submit_send(pattern(out_id, nbytes), peer, out_id)
                extra = 0 if index else local_extra if peer == rank else remote_extra if peer == previous else 0
                dst = np.zeros(nbytes + extra, np.uint8)
                service.submit_recv(dst, peer, in_id)
                expected.append((dst, pattern(in_id, nbytes), in_id))
        return expected

    for sizes in ([100, 200_000], [100, 200_000], [300, 50]):
        expected = submit(sizes)
        service.run()
        check(expected)
    submit([300, 50], local_extra=1)
    expect_error(service.run, TaskMismatchError, f"task_id={task_id(rank, rank, 0, world, base)}",
                 r"\b300 bytes", r"\b301 bytes")
    if world > 1:
        submit([300, 50], remote_extra=-1)
        expect_error(service.run, TaskMismatchError, "size mismatch", r"\b300 bytes", r"\b299 bytes")
    expected = submit([300, 50])
    service.run()
    check(expected)


def _local_error(service, rank, world, setup, message):
    """Only rank 0 submits the bad local ops; it raises the exact message, others name rank 0."""
    if rank == 0:
        setup()
        expect_error(service.run, RuntimeError, "^" + re.escape(message) + "$")
    else:
        expect_error(service.run, RuntimeError, "rank 0", re.escape(message))


@scenario
def local_none_task_id(service, rank, world, size):
    name = service.backend_name

    def setup():
        service.submit_send(np.zeros(4, np.uint8), rank, None)
        service.submit_recv(np.zeros(4, np.uint8), rank, None)

    _local_error(service, rank, world, setup,
                 f"{name}: local (same-rank) transfer requires a task_id to match sends with recvs")


@scenario
def local_unmatched_counts(service, rank, world, size):
    name = service.backend_name

    def setup():
        service.submit_send(np.zeros(4, np.uint8), rank, 1)
        service.submit_send(np.zeros(4, np.uint8), rank, 2)
        service.submit_recv(np.zeros(4, np.uint8), rank, 1)

    _local_error(service, rank, world, setup, f"{name}: unmatched local ops on rank 0: 2 local sends vs 1 local recvs")


@scenario
def local_missing_send(service, rank, world, size):
    name = service.backend_name

    def setup():
        service.submit_send(np.zeros(4, np.uint8), rank, 1)
        service.submit_recv(np.zeros(4, np.uint8), rank, 9)

    _local_error(service, rank, world, setup, f"{name}: missing local send for task_id=9 on rank 0")


@scenario
def works_again_after_errors(service, rank, world, size):
    expected = exchange(service, rank, world, [5, 70_000, 300_000], base=11)
    service.run()
    check(expected)


@scenario
def bad_arguments_are_rejected_at_submit(service, rank, world, size):
    expect_error(lambda: service.submit_send(np.zeros(4), world, 1), ValueError, "dest_rank", rf"\[0, {world}\)")
    expect_error(lambda: service.submit_recv(np.zeros(4), -1, 1), ValueError, "src_rank")
    expect_error(lambda: service.submit_send(np.zeros(4), 0, "x"), TypeError, "task_id")
    expect_error(lambda: service.submit_send(None, 0, 1), TypeError, "src_tensor")
    readonly = np.zeros(4)
    readonly.flags.writeable = False
    expect_error(lambda: service.submit_recv(readonly, 0, 1), ValueError, "dest_tensor", "writable")
    assert not service.send_ops and not service.recv_ops


ORDER = list(SCENARIOS)
