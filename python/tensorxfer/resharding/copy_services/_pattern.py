"""What a batched run derives from its queued ops, kept while the pattern repeats (private).

A pattern is the task ids and ranks of a run's sends and receives, in submit
order. From it follow which ops are same-rank and how they pair up
(match_local_ops_by_task_id), which are remote, and, with the byte sizes, the
remote op tables and their digest (see planning.matching). A resharding job submits
the same pattern every step: when a run's ids and ranks equal the last run's
(four list comparisons, no Python per op), all of that is reused. What may
change between such runs is still checked every run: the byte sizes (the
same-rank pairs must agree; changed remote sizes give new tables and digest)
and the tensors themselves (described anew by the caller).
"""

from __future__ import annotations

from typing import Any, List, Optional, Tuple

import numpy as np

from tensorxfer.resharding.copy_services import _tensors
from tensorxfer.resharding.copy_services._queue import Columns
from tensorxfer.resharding.copy_services.planning import matching, plan_cache
from tensorxfer.resharding.copy_services.base import TaskMismatchError, match_local_ops_by_task_id

_NO_ROWS = np.zeros(0, np.int64)


class _LocalOp:
    """A same-rank op for match_local_ops_by_task_id: task id + position in the queue."""

    __slots__ = ("task_id", "index")

    def __init__(self, task_id: Optional[int], index: int) -> None:
        self.task_id = task_id
        self.index = index


class _Side:
    """One direction (sends or receives) of a pattern."""

    def __init__(self, ids: List[Optional[int]], ranks: List[int], me: int) -> None:
        self.ids = ids
        self.ranks = ranks
        peers = np.fromiter(ranks, np.int64, len(ranks))
        self.local = np.flatnonzero(peers == me)
        self.remote = np.flatnonzero(peers != me)
        self.all_remote = self.remote.size == len(ids)
        self.remote_ids = ids if self.all_remote else [ids[i] for i in self.remote]
        self.remote_peers = peers[self.remote]

    def remote_part(self, tensors: List[Any], spans: _tensors.Spans) -> Tuple[List[Any], _tensors.Spans]:
        """The remote ops' tensors and spans, in the order of the op tables' LOCAL_INDEX."""
        if self.all_remote:
            return tensors, spans
        rows = self.remote
        return ([tensors[i] for i in rows],
                _tensors.Spans(spans.address[rows], spans.nbytes[rows], spans.contiguous[rows], spans.host[rows]))


class OpPattern:
    """The derived state of one pattern (see the module docstring)."""

    def __init__(self, backend: str, me: int, send_ids: List[Optional[int]], send_ranks: List[int],
                 recv_ids: List[Optional[int]], recv_ranks: List[int]) -> None:
        self.backend = backend
        self.me = me
        self.sends = _Side(send_ids, send_ranks, me)
        self.recvs = _Side(recv_ids, recv_ranks, me)
        # Same-rank pairs as (send rows, receive rows) in receive order, or why they do not pair.
        self.pairs: Tuple[np.ndarray, np.ndarray] = (_NO_ROWS, _NO_ROWS)
        self.pair_ids: List[Optional[int]] = []
        self.match_error: Optional[RuntimeError] = None
        if self.sends.local.size or self.recvs.local.size:
            try:
                pairs = match_local_ops_by_task_id([_LocalOp(send_ids[i], int(i)) for i in self.sends.local],
                                                   [_LocalOp(recv_ids[i], int(i)) for i in self.recvs.local],
                                                   backend, me)
            except RuntimeError as error:
                self.match_error = error
            else:
                self.pairs = (np.fromiter((send.index for send, _ in pairs), np.int64, len(pairs)),
                              np.fromiter((recv.index for _, recv in pairs), np.int64, len(pairs)))
                self.pair_ids = [send.task_id for send, _ in pairs]
        self._tables: Optional[Tuple[np.ndarray, np.ndarray, bytes]] = None

    def same_ops(self, send_ids: List[Optional[int]], send_ranks: List[int], recv_ids: List[Optional[int]],
                 recv_ranks: List[int]) -> bool:
        """True when a run's ops have this pattern's task ids and ranks, in the same order."""
        return (send_ranks == self.sends.ranks and recv_ranks == self.recvs.ranks
                and send_ids == self.sends.ids and recv_ids == self.recvs.ids)

    def local_error(self, send_nbytes: np.ndarray, recv_nbytes: np.ndarray) -> Optional[RuntimeError]:
        """Why this run's same-rank ops cannot be copied (unpaired, or a pair of different
        byte sizes: the first in receive order), or None."""
        if self.match_error is not None:
            return self.match_error
        send_rows, recv_rows = self.pairs
        if not send_rows.size:
            return None
        differ = np.flatnonzero(send_nbytes[send_rows] != recv_nbytes[recv_rows])
        if not differ.size:
            return None
        first = int(differ[0])
        sent, received = int(send_nbytes[send_rows[first]]), int(recv_nbytes[recv_rows[first]])
        return TaskMismatchError(
            f"{self.backend}: size mismatch for task_id={self.pair_ids[first]} on rank {self.me}: "
            f"the local send has {sent} bytes, the local recv {received} bytes"
        )

    def tables(self, send_nbytes: np.ndarray, recv_nbytes: np.ndarray,
               send_flags: Optional[np.ndarray] = None) -> Tuple[np.ndarray, np.ndarray, bytes]:
        """(send table, receive table, digest) of the remote ops with these byte sizes
        (every op's, in submit order) and send flags (the remote sends', or None for
        none: see matching.FLAGS); the last ones while sizes and flags stay the same."""
        if not self.sends.all_remote:
            send_nbytes = send_nbytes[self.sends.remote]
        if not self.recvs.all_remote:
            recv_nbytes = recv_nbytes[self.recvs.remote]
        cached = self._tables
        if (cached is not None and np.array_equal(cached[0][:, matching.NBYTES], send_nbytes)
                and np.array_equal(cached[1][:, matching.NBYTES], recv_nbytes)
                and (not cached[0][:, matching.FLAGS].any() if send_flags is None
                     else np.array_equal(cached[0][:, matching.FLAGS], send_flags))):
            return cached
        send_table = matching.op_table(self.sends.remote_ids, self.me, self.sends.remote_peers, send_nbytes,
                                        send_flags)
        recv_table = matching.op_table(self.recvs.remote_ids, self.recvs.remote_peers, self.me, recv_nbytes)
        self._tables = (send_table, recv_table, plan_cache.digest(send_table, recv_table))
        return self._tables


def pattern_for(last: Optional[OpPattern], backend: str, me: int, sends: Columns, recvs: Columns) -> OpPattern:
    """``last`` when the columns of this run's sends and receives
    have its pattern, else a new one."""
    if last is not None and last.same_ops(sends.task_ids, sends.ranks, recvs.task_ids, recvs.ranks):
        return last
    return OpPattern(backend, me, sends.task_ids, sends.ranks, recvs.task_ids, recvs.ranks)
