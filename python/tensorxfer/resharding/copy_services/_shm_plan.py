"""The shm backend's plan: which tasks the receiver reads directly, and the pipeline's schedule for the rest (private)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from tensorxfer import _core
from tensorxfer.resharding.copy_services import _tensors
from tensorxfer.resharding.copy_services.planning import matching

#: In an op table's FLAGS: the send's source lies in the sender's shared send buffer.
FLAG_IN_SEND_BUFFER = 1
#: In FLAGS: cross-memory attach reads the send's source about as fast as the pipeline moves
#: it or faster: it is smaller than ATTACH_PAGE_RULE_BYTES, or lies mostly in huge pages, or
#: the kernel cannot say. process_vm_readv pins the source page by page: from 4 KiB pages it
#: ran at about half the speed of huge ones, slower than the pipeline's two copies (see
#: attach_flags).
FLAG_ATTACH_READABLE = 2
#: Sources from this size on are read by cross-memory attach only from huge pages (2 MiB:
#: one huge page; a smaller source keeps its plan whatever pages it lands on).
ATTACH_PAGE_RULE_BYTES = 2 << 20

@dataclass
class ShmPlan:
    """This rank's part of a plan, reused while every rank submits the same ops."""

    digests: List[bytes]
    # Whether any rank moves bytes: every rank then takes part in the executor's barriers.
    has_remote_work: bool
    pipeline: Any  # _core.PipelinePlan
    # Pipeline tasks: schedule task id -> this rank's local op index (sends, receives).
    pipe_send_ids: np.ndarray
    pipe_send_local: np.ndarray
    pipe_recv_ids: np.ndarray
    pipe_recv_local: np.ndarray
    # Direct tasks (read by the receiver from the sender's memory: its shared send
    # buffer, else by cross-memory attach). any_direct: whether any rank has one (every
    # rank then takes part in the address exchange); this rank's (task ids, local op
    # indices) as sender, and as receiver with each task's source rank.
    any_direct: bool
    direct_send_ids: np.ndarray
    direct_send_local: np.ndarray
    direct_recv_ids: np.ndarray
    direct_recv_local: np.ndarray
    direct_recv_src: np.ndarray
    staging: Dict[Tuple[str, int], object] = field(default_factory=dict)


def build_shm_plan(backend: str, me: int, world_size: int, tables: Sequence[Tuple[np.ndarray, np.ndarray]],
                   digests: List[bytes], slot_nbytes: int, max_tasks_per_batch: int, cma_min_bytes: Optional[int],
                   cma_pairs: np.ndarray) -> ShmPlan:
    """This rank's plan from every rank's op tables (the same input on every rank): direct
    tasks (sources in the sender's send buffer, any size; large ones cross-memory attach
    reads fast, where it is permitted) and the pipeline's schedule for the rest."""
    sends, recvs = matching.match_tables(backend, tables)
    count = sends.shape[0]
    ids = np.arange(count, dtype=np.int64)  # the schedule's task ids: key order, the same on every rank
    src, dst, nbytes = sends[:, matching.SRC], sends[:, matching.DST], sends[:, matching.NBYTES]
    # Direct: sources in the sender's send buffer (any size), and those of cma_min_bytes
    # or more that cross-memory attach reads fast (FLAG_ATTACH_READABLE) where it is
    # permitted; the rest goes through the pipeline.
    flags = sends[:, matching.FLAGS]
    direct = (flags & FLAG_IN_SEND_BUFFER) != 0
    if cma_min_bytes is not None and count:
        direct |= (nbytes >= cma_min_bytes) & ((flags & FLAG_ATTACH_READABLE) != 0) & cma_pairs[src, dst]
    direct &= nbytes > 0
    pipe = ~direct & (nbytes > 0)
    rows = np.stack([ids[pipe], nbytes[pipe], src[pipe], dst[pipe]], axis=1) if count else np.zeros((0, 4), np.int64)
    pipeline = _core.plan_pipeline(rows, world_size, slot_nbytes, max_tasks_per_batch, me)
    mine_send = pipe & (src == me)
    mine_recv = pipe & (dst == me)
    # Every rank takes part in the executor's barriers (and the address exchange)
    # when any rank has something to move, so the condition is global.
    return ShmPlan(
        digests=digests,
        has_remote_work=bool(pipeline.num_iterations or direct.any()),
        pipeline=pipeline,
        pipe_send_ids=ids[mine_send].astype(np.uint64),
        pipe_send_local=sends[mine_send, matching.LOCAL_INDEX],
        pipe_recv_ids=ids[mine_recv].astype(np.uint64),
        pipe_recv_local=recvs[mine_recv, matching.LOCAL_INDEX],
        any_direct=bool(direct.any()),
        direct_send_ids=ids[direct & (src == me)],
        direct_send_local=sends[direct & (src == me), matching.LOCAL_INDEX],
        direct_recv_ids=ids[direct & (dst == me)],
        direct_recv_local=recvs[direct & (dst == me), matching.LOCAL_INDEX],
        direct_recv_src=src[direct & (dst == me)],
    )


def attach_flags(spans: _tensors.Spans, rows: np.ndarray, cma_min_bytes: int) -> np.ndarray:
    """FLAG_ATTACH_READABLE for each send ``spans[rows]`` of ``cma_min_bytes`` or more that
    cross-memory attach reads fast: below ATTACH_PAGE_RULE_BYTES any source; from there a
    contiguous one whose bytes lie at least half in huge pages, or where the kernel cannot
    say (``_core.huge_page_bytes``). A non-contiguous large source is staged into new
    (4 KiB) pages at run time: not flagged. Measured between two processes on 2 cores,
    302 MB each way in 25 MB tensors: from 4 KiB pages (torch's allocations) the reads took
    40-44 ms where the pipeline took 31-33 ms; from huge pages (numpy's large arrays) 20-30 ms."""
    nbytes = spans.nbytes[rows]
    flags = np.where(nbytes >= cma_min_bytes, FLAG_ATTACH_READABLE, 0).astype(np.int64)
    large = np.flatnonzero(nbytes >= max(cma_min_bytes, ATTACH_PAGE_RULE_BYTES))
    if large.size:
        sizes = nbytes[large]
        huge = _core.huge_page_bytes(spans.address[rows[large]].astype(np.uint64), sizes.astype(np.uint64))
        readable = spans.contiguous[rows[large]] & ((huge < 0) | (2 * huge >= sizes))
        flags[large[~readable]] = 0
    return flags


def published_for_receives(backend: str, plan: ShmPlan, rows: np.ndarray) -> np.ndarray:
    """The rows senders published (task, address, offset in the send buffer; sorted by
    task) for this rank's direct receives, in plan.direct_recv_ids order."""
    wanted = plan.direct_recv_ids.astype(np.uint64)
    where = np.searchsorted(rows[:, 0], wanted)
    if np.any(where >= rows.shape[0]) or np.any(rows[np.minimum(where, max(rows.shape[0] - 1, 0)), 0] != wanted):
        raise RuntimeError(f"{backend}: a sender did not publish the address of a direct task")
    return rows[where]
