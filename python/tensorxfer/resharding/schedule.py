"""The transfer schedule behind the pipelined copy service.

Every rank all-gathers the metadata of every rank's sends and receives -- rows
of ``(task_id, nbytes, src_rank, dest_rank)`` -- and calls :func:`build_schedule`
with it. The native core matches sends with receives (a missing counterpart or
a size mismatch raises ``ValueError`` naming the task, before any byte moves),
cuts tasks larger than a slot into segments, packs each (source, destination)
pair's segments into slot-sized batches (largest first, bounded by slot bytes
and task count) and places the batches into iterations so that no rank sends
twice or receives twice in one iteration. The result is identical on every
rank and across runs for the same metadata, in whatever order it was gathered.

The request and batch types keep the upstream names and fields
(``SendRequest(task_id, src_tensor, src_pos, size, dest_pe)``,
``ReceiveRequest(task_id, dest_tensor, dest_pos, size, src_pe)``,
``ScheduledBatch(src_pe, dest_pe, batch_index, iteration, tasks, total_size)``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import numpy as np

from tensorxfer import _core

#: Upstream's default bound on the segments one batch carries.
MAX_TASKS_PER_BATCH = 10000


@dataclass
class SendRequest:
    """``size`` bytes of ``src_tensor`` starting at byte ``src_pos`` go to rank ``dest_pe``."""

    task_id: int
    src_tensor: Any
    src_pos: int
    size: int
    dest_pe: int


@dataclass
class ReceiveRequest:
    """``size`` bytes from rank ``src_pe`` land in ``dest_tensor`` at byte ``dest_pos``."""

    task_id: int
    dest_tensor: Any
    dest_pos: int
    size: int
    src_pe: int


@dataclass(frozen=True)
class BatchTask:
    """One segment of a batch: a task's bytes and where they travel in the slot.

    Bytes ``[task_offset, task_offset + size)`` of task ``task_id`` travel at
    ``slot_offset`` of the batch's slot (64-byte aligned).
    """

    task_id: int
    task_offset: int
    size: int
    slot_offset: int


@dataclass
class ScheduledBatch:
    """What ``src_pe`` packs for ``dest_pe`` in ``iteration``.

    ``batch_index`` numbers the batches of that pair from 0, ``total_size`` is the
    packed extent.
    """

    src_pe: int
    dest_pe: int
    batch_index: int
    iteration: int
    tasks: List[BatchTask] = field(default_factory=list)
    total_size: int = 0


@dataclass
class TransferSchedule:
    """All batches of one run, ordered by ``(iteration, src_pe)``."""

    num_iterations: int
    batches: List[ScheduledBatch]

    def iteration_schedules(self, pe: int) -> List[Dict[str, Optional[ScheduledBatch]]]:
        """Per iteration, the batch rank ``pe`` sends and the one it receives.

        Args:
            pe: the rank.

        Returns:
            One ``{"send": batch or None, "recv": batch or None}`` per iteration, the form
            ``PipelineExecutor.execute_pipeline`` takes.
        """
        schedules: List[Dict[str, Optional[ScheduledBatch]]] = [
            {"send": None, "recv": None} for _ in range(self.num_iterations)
        ]
        for batch in self.batches:
            if batch.src_pe == pe:
                schedules[batch.iteration]["send"] = batch
            if batch.dest_pe == pe:
                schedules[batch.iteration]["recv"] = batch
        return schedules


Rows = Union[np.ndarray, Sequence[Tuple[int, int, int, int]]]


def _as_rows(rows: Rows, argument: str) -> np.ndarray:
    array = np.asarray(rows, dtype=np.int64)
    if array.size == 0:
        return np.zeros((0, 4), dtype=np.int64)
    if array.ndim != 2 or array.shape[1] != 4:
        raise ValueError(f"{argument} must be rows of (task_id, nbytes, src_rank, dest_rank), "
                         f"got an array of shape {array.shape}")
    return np.ascontiguousarray(array)


def build_schedule(sends: Rows, receives: Rows, world_size: int, *, slot_nbytes: int,
                   max_tasks_per_batch: int = MAX_TASKS_PER_BATCH) -> TransferSchedule:
    """Computes the schedule from every rank's gathered metadata.

    Same-rank tasks are not scheduled: the executor copies them with
    ``process_self_moves``.

    Args:
        sends: rows ``(task_id, nbytes, src_rank, dest_rank)`` (a send is declared by
            its ``src_rank``).
        receives: rows of the same form (a receive is declared by its ``dest_rank``).
        world_size: the number of ranks.
        slot_nbytes: bounds a batch (a multiple of 64).
        max_tasks_per_batch: bounds a batch's segments.

    Returns:
        The :class:`TransferSchedule`, identical on every rank for the same metadata.

    Raises:
        ValueError: naming the task for a missing or duplicated counterpart, a size or
            rank disagreement; and for invalid limits.
    """
    num_iterations, raw_batches = _core.build_transfer_schedule(
        _as_rows(sends, "sends"), _as_rows(receives, "receives"), int(world_size), int(slot_nbytes),
        int(max_tasks_per_batch))
    batches = [
        ScheduledBatch(src_pe=src, dest_pe=dest, batch_index=index, iteration=iteration,
                       tasks=[BatchTask(*map(int, row)) for row in segments], total_size=total)
        for src, dest, index, iteration, total, segments in raw_batches
    ]
    return TransferSchedule(num_iterations=num_iterations, batches=batches)


def request_rows(send_requests: Iterable[SendRequest], receive_requests: Iterable[ReceiveRequest],
                 my_pe: int) -> Tuple[np.ndarray, np.ndarray]:
    """This rank's metadata rows, ready to all-gather: ``(send_rows, receive_rows)``."""
    sends = [(r.task_id, r.size, my_pe, r.dest_pe) for r in send_requests]
    receives = [(r.task_id, r.size, r.src_pe, my_pe) for r in receive_requests]
    return _as_rows(sends, "send_requests"), _as_rows(receives, "receive_requests")


__all__ = ["BatchTask", "MAX_TASKS_PER_BATCH", "ReceiveRequest", "ScheduledBatch", "SendRequest",
           "TransferSchedule", "build_schedule", "request_rows"]
