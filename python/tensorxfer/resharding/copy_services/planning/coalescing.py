"""Planning step 3, coalescing: a window's small tasks for one peer travel as one message (private).

In a window, a rank's tasks for one peer smaller than ``coalesce_bytes`` are
packed back to back into one message; larger ones go alone. Per ordered pair
the messages are numbered (the tag) in window order, packed first, then single
tasks in key order; both ends count alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Tuple

import numpy as np

from tensorxfer.resharding.copy_services.planning.matching import LOCAL_INDEX, NBYTES


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

    @property
    def has_remote_work(self) -> bool:
        """Whether this rank sends or receives any message."""
        return bool(self.windows)


def messages(rows: np.ndarray, windows: np.ndarray, peer_column: int, coalesce_bytes: int,
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




def plan_windows(send_packed: List[List[PackedMessage]], send_single: List[List[SingleMessage]],
                 recv_packed: List[List[PackedMessage]], recv_single: List[List[SingleMessage]]) -> List[Window]:
    """The windows in which this rank has messages."""
    windows = [Window(w, send_packed[w], send_single[w], recv_packed[w], recv_single[w])
               for w in range(len(send_packed))]
    return [w for w in windows if w.sends_packed or w.sends_single or w.recvs_packed or w.recvs_single]


def largest_packed(windows: List[Window]) -> Tuple[Dict[int, int], Dict[int, int]]:
    """peer -> the largest packed message sent to it, and received from it."""
    sent: Dict[int, int] = {}
    received: Dict[int, int] = {}
    for window in windows:
        for message in window.sends_packed:
            sent[message.peer] = max(sent.get(message.peer, 0), message.total)
        for message in window.recvs_packed:
            received[message.peer] = max(received.get(message.peer, 0), message.total)
    return sent, received
