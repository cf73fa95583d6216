"""Planning step 2, windows: a huge batch moves in bounded windows (private).

Each sender's tasks, in key order (task-id order), are cut into windows of at
most ``max_count`` tasks and about ``max_bytes`` bytes (a window closes at the
first task that starts past the byte bound). A task's window is computed from
the gathered tables, so both of its ends put it in the same window; a rank's
window k then only waits on other ranks' window k: no cycle, no deadlock.
Every rank sends in window k at the same time; a rank may receive up to
(world - 1) windows' worth in one window.
"""

from __future__ import annotations

import numpy as np

from tensorxfer.resharding.copy_services.planning.matching import NBYTES, SRC


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




def window_of_each_task(sends: np.ndarray, max_count: int, max_bytes: int) -> np.ndarray:
    """The window of every matched send (rows in key order), each sender cut alone."""
    windows = np.zeros(sends.shape[0], np.int64)
    for sender in np.unique(sends[:, SRC]):
        rows = np.flatnonzero(sends[:, SRC] == sender)  # in key order
        windows[rows] = assign_windows(sends[rows, NBYTES], max_count, max_bytes)
    return windows
