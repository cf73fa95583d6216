"""Planning a batch of remote sends and receives, one step per module (private).

Every rank contributes a table of its remote ops; every rank receives all
tables and computes the same global plan from them:

1. :mod:`.matching`: pair each send with its receive (task id, ranks, byte size);
2. :mod:`.windows`: cut each sender's tasks into bounded windows;
3. :mod:`.coalescing`: pack a window's small tasks per peer into one message;
4. :mod:`.plan_cache`: reuse the plan while every rank's ops stay the same.
"""

from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

import numpy as np

from tensorxfer.resharding.copy_services.planning import coalescing, matching, windows


def build_plan(backend: str, rank: int, tables: Sequence[Tuple[np.ndarray, np.ndarray]], digests: List[bytes],
               max_count: int, max_bytes: int, coalesce_bytes: int) -> coalescing.Plan:
    """This rank's plan from every rank's (sends, recvs) tables (identical input on every rank)."""
    sends, recvs = matching.match_tables(backend, tables)
    window = windows.window_of_each_task(sends, max_count, max_bytes)
    num_windows = int(window.max()) + 1 if window.size else 0
    mine_send = sends[:, matching.SRC] == rank
    mine_recv = recvs[:, matching.DST] == rank
    send_tags: Dict[int, int] = {}
    recv_tags: Dict[int, int] = {}
    send_packed, send_single = coalescing.messages(sends[mine_send], window[mine_send], matching.DST,
                                                   coalesce_bytes, send_tags, num_windows)
    recv_packed, recv_single = coalescing.messages(recvs[mine_recv], window[mine_recv], matching.SRC,
                                                   coalesce_bytes, recv_tags, num_windows)
    plan_windows = coalescing.plan_windows(send_packed, send_single, recv_packed, recv_single)
    max_send, max_recv = coalescing.largest_packed(plan_windows)
    peers = sorted(set(send_tags) | set(recv_tags))
    return coalescing.Plan(digests, plan_windows, peers, max_send, max_recv, int(sends.shape[0]))


__all__ = ["build_plan", "coalescing", "matching", "windows"]
