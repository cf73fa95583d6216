"""Planning a batch of remote sends and receives (private).

Every rank contributes a table of its remote ops; every rank receives all
tables and computes the same global plan from them:

1. matching: each task is keyed by its task id, or, for ops submitted with
   ``task_id=None``, by (source, destination, submission index on that pair).
   Every key needs exactly one send and one receive, with the same ranks and
   the same byte size; otherwise ``TaskMismatchError`` (the same on every rank).
2. windows: each sender's tasks, in key order (task-id order), are cut into
   windows of at most ``max_count`` tasks and about ``max_bytes`` bytes (a
   window closes at the first task that starts past the byte bound). A task's
   window is computed from the gathered tables, so both of its ends put it in
   the same window; a rank's window k then only waits on other ranks' window k:
   no cycle, no deadlock. Every rank sends in window k at the same time (the
   directions overlap whatever the numbering of the task ids); a rank may
   receive up to (world - 1) windows' worth in one window.
3. messages: in a window, a rank's tasks for one peer smaller than
   ``coalesce_bytes`` travel as one packed message; larger ones go alone.
   Per ordered pair the messages are numbered (the tag) in window order,
   packed first, then single tasks in key order; both ends count alike.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple, cast

import numpy as np

from tensorxfer.resharding.copy_services.base import TaskMismatchError

# Columns of an op table (int64): the key (anon, a, b), the op itself, and
# backend-specific flags of the op (see FLAG_*; part of the plan's digest).
# Explicit task id: anon=0, a=task_id, b=0. task_id=None: anon=1, a=src*2^31+dst, b=index.
ANON, KEY_A, KEY_B, SRC, DST, NBYTES, LOCAL_INDEX, FLAGS = range(8)
COLUMNS = 8
_PAIR_SHIFT = 31
#: A send whose source lies in the sender's shared send buffer (shm backend).
FLAG_IN_SEND_BUFFER = 1


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


def digest(*tables: np.ndarray) -> bytes:
    """16 bytes that change whenever any op of the tables does."""
    hasher = hashlib.blake2b(digest_size=16)
    for table in tables:
        hasher.update(np.int64(table.shape[0]).tobytes())
        hasher.update(np.ascontiguousarray(table).tobytes())
    return hasher.digest()


def _sorted_by_key(table: np.ndarray) -> np.ndarray:
    order = np.lexsort((table[:, KEY_B], table[:, KEY_A], table[:, ANON]))
    return table[order]


def _describe_task(row: np.ndarray) -> str:
    if row[ANON]:
        return f"the untagged (task_id=None) transfer #{int(row[KEY_B])} from rank {int(row[SRC])} to rank {int(row[DST])}"
    return f"task_id={int(row[KEY_A])}"


def _first_duplicate(table: np.ndarray) -> Optional[int]:
    if table.shape[0] < 2:
        return None
    same = np.all(table[1:, :KEY_B + 1] == table[:-1, :KEY_B + 1], axis=1)
    hits = np.flatnonzero(same)
    return None if hits.size == 0 else int(hits[0])


def match(backend: str, sends: np.ndarray, recvs: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Sends and receives of all ranks, sorted by key and paired row by row.

    Raises TaskMismatchError naming the first (lowest-key) offending task: a
    key sent or received twice, a send without a receive or the reverse, ranks
    that disagree, or byte sizes that differ.
    """
    sends, recvs = _sorted_by_key(sends), _sorted_by_key(recvs)
    for table, verb in ((sends, "sent"), (recvs, "received")):
        duplicate = _first_duplicate(table)
        if duplicate is not None:
            first, second = table[duplicate], table[duplicate + 1]
            raise TaskMismatchError(
                f"{backend}: {_describe_task(first)} is {verb} twice: rank {int(first[SRC])} -> rank "
                f"{int(first[DST])} and rank {int(second[SRC])} -> rank {int(second[DST])}"
            )
    keys_equal = sends.shape == recvs.shape and np.array_equal(sends[:, :KEY_B + 1], recvs[:, :KEY_B + 1])
    if not keys_equal:
        _raise_missing(backend, sends, recvs)
    ranks_differ = np.flatnonzero((sends[:, SRC] != recvs[:, SRC]) | (sends[:, DST] != recvs[:, DST]))
    if ranks_differ.size:
        send, recv = sends[ranks_differ[0]], recvs[ranks_differ[0]]
        raise TaskMismatchError(
            f"{backend}: {_describe_task(send)}: rank {int(send[SRC])} sends it to rank {int(send[DST])}, "
            f"but rank {int(recv[DST])} expects it from rank {int(recv[SRC])}"
        )
    sizes_differ = np.flatnonzero(sends[:, NBYTES] != recvs[:, NBYTES])
    if sizes_differ.size:
        send, recv = sends[sizes_differ[0]], recvs[sizes_differ[0]]
        raise TaskMismatchError(
            f"{backend}: size mismatch for {_describe_task(send)}: rank {int(send[SRC])} sends "
            f"{int(send[NBYTES])} bytes, rank {int(recv[DST])} receives {int(recv[NBYTES])} bytes"
        )
    return sends, recvs


def _raise_missing(backend: str, sends: np.ndarray, recvs: np.ndarray) -> None:
    send_keys = {tuple(row[:KEY_B + 1]): row for row in sends}
    recv_keys = {tuple(row[:KEY_B + 1]): row for row in recvs}
    missing_recv = [key for key in send_keys if key not in recv_keys]
    missing_send = [key for key in recv_keys if key not in send_keys]
    first_missing_recv = min(missing_recv) if missing_recv else None
    first_missing_send = min(missing_send) if missing_send else None
    if first_missing_send is None or (first_missing_recv is not None and first_missing_recv < first_missing_send):
        assert first_missing_recv is not None  # the keys differ, so one side misses one
        row = send_keys[first_missing_recv]
        raise TaskMismatchError(
            f"{backend}: missing recv for {_describe_task(row)}: rank {int(row[SRC])} sends "
            f"{int(row[NBYTES])} bytes to rank {int(row[DST])}, which submitted no matching receive"
        )
    row = recv_keys[first_missing_send]
    raise TaskMismatchError(
        f"{backend}: missing send for {_describe_task(row)}: rank {int(row[DST])} receives "
        f"{int(row[NBYTES])} bytes from rank {int(row[SRC])}, which submitted no matching send"
    )


def assign_windows(nbytes: np.ndarray, max_count: int, max_bytes: int) -> np.ndarray:
    """Window index of each task (tasks in key order): a new window starts every
    max_count tasks and whenever a task starts past another max_bytes bytes."""
    count = nbytes.shape[0]
    if count == 0:
        return np.zeros(0, np.int64)
    starts = np.cumsum(nbytes) - nbytes
    count_bucket = np.arange(count) // max_count
    byte_bucket = starts // max_bytes
    change = (count_bucket[1:] != count_bucket[:-1]) | (byte_bucket[1:] != byte_bucket[:-1])
    return np.concatenate(([0], np.cumsum(change))).astype(np.int64)


@dataclass
class PackedMessage:
    """Several small tasks for one peer, back to back in one message."""

    peer: int
    tag: int
    local_indices: np.ndarray  # into this rank's op list, in packing order
    nbytes: np.ndarray  # bytes of each task
    total: int


@dataclass
class SingleMessage:
    """One task large enough to travel alone."""

    peer: int
    tag: int
    local_index: int
    nbytes: int


@dataclass
class Window:
    """This rank's messages in one window."""

    index: int  # the global window number (the same on every rank)
    sends_packed: List[PackedMessage] = field(default_factory=list)
    sends_single: List[SingleMessage] = field(default_factory=list)
    recvs_packed: List[PackedMessage] = field(default_factory=list)
    recvs_single: List[SingleMessage] = field(default_factory=list)


@dataclass
class Plan:
    """This rank's part of a global plan, reusable while every rank submits the same ops."""

    digests: List[bytes]
    windows: List[Window]
    peers: List[int]  # ranks this rank exchanges messages with
    max_send_packed: Dict[int, int]  # peer -> largest packed message sent to it
    max_recv_packed: Dict[int, int]
    task_count: int
    staging: Dict[Tuple[str, int], object] = field(default_factory=dict)  # reused buffers


def _messages(rows: np.ndarray, windows: np.ndarray, peer_column: int, coalesce_bytes: int,
              tags: Dict[int, int], num_windows: int) -> Tuple[List[List[PackedMessage]], List[List[SingleMessage]]]:
    """This rank's packed and single messages per window, for rows (in key order) of its side."""
    packed: List[List[PackedMessage]] = [[] for _ in range(num_windows)]
    single: List[List[SingleMessage]] = [[] for _ in range(num_windows)]
    if rows.shape[0] == 0:
        return packed, single
    peers = rows[:, peer_column]
    small = rows[:, NBYTES] < coalesce_bytes
    # Group by (window, peer) keeping key order inside each group.
    order = np.lexsort((np.arange(rows.shape[0]), peers, windows))
    group_key = windows[order] * (1 << 32) + peers[order]
    boundaries = np.flatnonzero(np.diff(group_key)) + 1
    for group in np.split(order, boundaries):
        window, peer = int(windows[group[0]]), int(peers[group[0]])
        small_rows = group[small[group]]
        if small_rows.size:
            sizes = rows[small_rows, NBYTES]
            total = int(sizes.sum())
            if total > 0:
                tag = tags.get(peer, 0)
                tags[peer] = tag + 1
            else:
                tag = -1  # nothing to send: both ends skip the message
            packed[window].append(PackedMessage(peer, tag, rows[small_rows, LOCAL_INDEX].copy(), sizes.copy(), total))
        for index in group[~small[group]]:
            tag = tags.get(peer, 0)
            tags[peer] = tag + 1
            single[window].append(SingleMessage(peer, tag, int(rows[index, LOCAL_INDEX]), int(rows[index, NBYTES])))
    return packed, single


def build_plan(backend: str, rank: int, tables: Sequence[Tuple[np.ndarray, np.ndarray]], digests: List[bytes],
               max_count: int, max_bytes: int, coalesce_bytes: int) -> Plan:
    """This rank's plan from every rank's (sends, recvs) tables (identical input on every rank)."""
    all_sends = np.concatenate([sends for sends, _ in tables]) if tables else np.zeros((0, COLUMNS), np.int64)
    all_recvs = np.concatenate([recvs for _, recvs in tables]) if tables else np.zeros((0, COLUMNS), np.int64)
    sends, recvs = match(backend, all_sends, all_recvs)
    windows = np.zeros(sends.shape[0], np.int64)
    for sender in np.unique(sends[:, SRC]):
        rows = np.flatnonzero(sends[:, SRC] == sender)  # in key order
        windows[rows] = assign_windows(sends[rows, NBYTES], max_count, max_bytes)
    num_windows = int(windows.max()) + 1 if windows.size else 0
    mine_send = sends[:, SRC] == rank
    mine_recv = recvs[:, DST] == rank
    send_rows = sends[mine_send]
    recv_rows = recvs[mine_recv]
    send_tags: Dict[int, int] = {}
    recv_tags: Dict[int, int] = {}
    send_packed, send_single = _messages(send_rows, windows[mine_send], DST, coalesce_bytes, send_tags, num_windows)
    recv_packed, recv_single = _messages(recv_rows, windows[mine_recv], SRC, coalesce_bytes, recv_tags, num_windows)
    plan_windows = [Window(w, send_packed[w], send_single[w], recv_packed[w], recv_single[w]) for w in range(num_windows)]
    plan_windows = [w for w in plan_windows if w.sends_packed or w.sends_single or w.recvs_packed or w.recvs_single]
    max_send: Dict[int, int] = {}
    max_recv: Dict[int, int] = {}
    for window in plan_windows:
        for message in window.sends_packed:
            max_send[message.peer] = max(max_send.get(message.peer, 0), message.total)
        for message in window.recvs_packed:
            max_recv[message.peer] = max(max_recv.get(message.peer, 0), message.total)
    peers = sorted(set(send_tags) | set(recv_tags))
    return Plan(digests, plan_windows, peers, max_send, max_recv, int(sends.shape[0]))


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
