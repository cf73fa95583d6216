"""Planning step 1, matching: every remote send paired with its receive (private).

Every rank contributes a table of its remote ops (:func:`op_table`); every rank
receives all tables and pairs them alike. Each task is keyed by its task id,
or, for ops submitted with ``task_id=None``, by (source, destination,
submission index on that pair). Every key needs exactly one send and one
receive, with the same ranks and the same byte size; otherwise
``TaskMismatchError`` naming the lowest-key offending task (the same on every rank).
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Sequence, Tuple, cast

import numpy as np

from tensorxfer import _core
from tensorxfer.resharding.copy_services.base import TaskMismatchError

# Columns of an op table (int64): the key (anon, a, b), the op itself, and
# backend-specific flags of the op (part of the plan's digest; the shm backend
# marks sources in its send buffer there).
# Explicit task id: anon=0, a=task_id, b=0. task_id=None: anon=1, a=src*2^31+dst, b=index.
ANON, KEY_A, KEY_B, SRC, DST, NBYTES, LOCAL_INDEX, FLAGS = range(8)
COLUMNS = 8
_PAIR_SHIFT = 31


def op_table(task_ids: Sequence[Optional[int]], sources: Any, destinations: Any, nbytes: Any,
             flags: Any = None) -> np.ndarray:
    """The (n, COLUMNS) int64 table of n remote ops, LOCAL_INDEX = position in the given lists."""
    count = len(task_ids)
    table = np.zeros((count, COLUMNS), np.int64)
    if count == 0:
        return table
    table[:, SRC] = sources
    table[:, DST] = destinations
    table[:, NBYTES] = nbytes
    table[:, LOCAL_INDEX] = np.arange(count)
    if flags is not None:
        table[:, FLAGS] = flags
    try:
        table[:, KEY_A] = np.fromiter(cast(Sequence[int], task_ids), np.int64, count)
        return table
    except TypeError:  # some ops are untagged (task_id=None)
        pass
    anonymous = [i for i, task_id in enumerate(task_ids) if task_id is None]
    named = [i for i, task_id in enumerate(task_ids) if task_id is not None]
    table[named, KEY_A] = [cast(int, task_ids[i]) for i in named]
    next_index: Dict[Tuple[int, int], int] = {}
    for i in anonymous:
        pair = (int(table[i, SRC]), int(table[i, DST]))
        index = next_index.get(pair, 0)
        next_index[pair] = index + 1
        table[i, ANON] = 1
        table[i, KEY_A] = (pair[0] << _PAIR_SHIFT) + pair[1]
        table[i, KEY_B] = index
    return table


def _describe_task(row: np.ndarray) -> str:
    if row[ANON]:
        return f"the untagged (task_id=None) transfer #{int(row[KEY_B])} from rank {int(row[SRC])} to rank {int(row[DST])}"
    return f"task_id={int(row[KEY_A])}"


def match_tables(backend: str, tables: Sequence[Tuple[np.ndarray, np.ndarray]]) -> Tuple[np.ndarray, np.ndarray]:
    """:func:`match` of every rank's (sends, recvs) tables, concatenated in rank order."""
    empty = np.zeros((0, COLUMNS), np.int64)
    all_sends = np.concatenate([sends for sends, _ in tables]) if tables else empty
    all_recvs = np.concatenate([recvs for _, recvs in tables]) if tables else empty
    return match(backend, all_sends, all_recvs)


def match(backend: str, sends: np.ndarray, recvs: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Sends and receives of all ranks, sorted by key and paired row by row.

    The pairing is the schedule's C++ matcher (``resharding/task_matcher.h``), on
    each key's rank among all keys. Raises TaskMismatchError naming the first
    (lowest-key) offending task: a key sent or received twice, a send without a
    receive or the reverse, ranks that disagree, or byte sizes that differ.
    """
    keys = np.concatenate([sends[:, :KEY_B + 1], recvs[:, :KEY_B + 1]])
    if keys.shape[0] == 0:
        return sends, recvs
    # Each key's rank in key order (anon, a, b), as the matcher's task id.
    order = np.lexsort((keys[:, KEY_B], keys[:, KEY_A], keys[:, ANON]))
    ordered = keys[order]
    new_key = np.concatenate(([True], np.any(ordered[1:] != ordered[:-1], axis=1)))
    dense = np.empty(keys.shape[0], np.int64)
    dense[order] = np.cumsum(new_key) - 1
    count = sends.shape[0]
    problem, send_index, recv_index, other_index, pairs = _core.find_task_pairs(
        _endpoint_rows(dense[:count], sends), _endpoint_rows(dense[count:], recvs))
    if problem:
        _raise_problem(backend, problem, sends, recvs, send_index, recv_index, other_index)
    return sends[pairs[:, 0]], recvs[pairs[:, 1]]


def _endpoint_rows(task_ids: np.ndarray, table: np.ndarray) -> np.ndarray:
    return np.stack([task_ids, table[:, NBYTES], table[:, SRC], table[:, DST]], axis=1)


def _raise_problem(backend: str, problem: str, sends: np.ndarray, recvs: np.ndarray, send_index: int,
                   recv_index: int, other_index: int) -> None:
    if problem in ("duplicate_send", "duplicate_receive"):
        table, first_index, verb = (sends, send_index, "sent") if problem == "duplicate_send" else (recvs, recv_index,
                                                                                                   "received")
        first, second = table[first_index], table[other_index]
        raise TaskMismatchError(
            f"{backend}: {_describe_task(first)} is {verb} twice: rank {int(first[SRC])} -> rank "
            f"{int(first[DST])} and rank {int(second[SRC])} -> rank {int(second[DST])}"
        )
    if problem == "missing_receive":
        row = sends[send_index]
        raise TaskMismatchError(
            f"{backend}: missing recv for {_describe_task(row)}: rank {int(row[SRC])} sends "
            f"{int(row[NBYTES])} bytes to rank {int(row[DST])}, which submitted no matching receive"
        )
    if problem == "missing_send":
        row = recvs[recv_index]
        raise TaskMismatchError(
            f"{backend}: missing send for {_describe_task(row)}: rank {int(row[DST])} receives "
            f"{int(row[NBYTES])} bytes from rank {int(row[SRC])}, which submitted no matching send"
        )
    send, recv = sends[send_index], recvs[recv_index]
    if problem == "ranks_differ":
        raise TaskMismatchError(
            f"{backend}: {_describe_task(send)}: rank {int(send[SRC])} sends it to rank {int(send[DST])}, "
            f"but rank {int(recv[DST])} expects it from rank {int(recv[SRC])}"
        )
    raise TaskMismatchError(
        f"{backend}: size mismatch for {_describe_task(send)}: rank {int(send[SRC])} sends "
        f"{int(send[NBYTES])} bytes, rank {int(recv[DST])} receives {int(recv[NBYTES])} bytes"
    )


def encode_tables(sends: np.ndarray, recvs: np.ndarray) -> bytes:
    """Bytes of a rank's two op tables, for the all-gather."""
    header = np.array([sends.shape[0], recvs.shape[0]], np.int64)
    return header.tobytes() + np.ascontiguousarray(sends).tobytes() + np.ascontiguousarray(recvs).tobytes()


def decode_tables(data: bytes) -> Tuple[np.ndarray, np.ndarray]:
    """The inverse of encode_tables; ValueError if the bytes do not fit."""
    buffer = np.frombuffer(data, np.int64)
    if buffer.size < 2:
        raise ValueError(f"op tables: expected at least 16 bytes, got {len(data)}")
    num_sends, num_recvs = int(buffer[0]), int(buffer[1])
    expected = 2 + (num_sends + num_recvs) * COLUMNS
    if num_sends < 0 or num_recvs < 0 or buffer.size != expected:
        raise ValueError(f"op tables: expected {expected * 8} bytes for {num_sends} sends and {num_recvs} recvs, got {len(data)}")
    sends = buffer[2:2 + num_sends * COLUMNS].reshape(num_sends, COLUMNS)
    recvs = buffer[2 + num_sends * COLUMNS:].reshape(num_recvs, COLUMNS)
    return sends, recvs
