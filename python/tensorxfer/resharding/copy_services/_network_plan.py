"""Planning a persistent plan's transfers between hosts: streams, replica chains, messages (private).

Every rank computes the same streams from the same input: the matched op tables of the
tasks that cross hosts (planning.matching, key order) and the host of every rank.

* **Streams.** The tasks from one sender to one receiver form one byte stream, in task
  order, cut into messages by their sizes alone (``_core.message_sizes``: small tasks share
  buckets, a large one starts its own messages), so both ends cut it alike. Every stream
  runs at once in a run: every sender is busy, no rank funnels another's bytes.
* **Replica chains.** Sends of one sender whose FLAGS carry the same non-zero source key
  (the same memory: address, dtype size, shape and strides, see :func:`source_keys`) to
  several receivers on other hosts are one *item* travelling a chain: the sender sends it to
  the first receiver only, and each receiver forwards every message to the next as soon as
  it arrived, while the next one is on the wire. The sender's NIC carries each byte once,
  whatever the number of replicas. Items of one sender with the same chain share a stream.
  Receivers are ordered by host, then rank, so a chain crosses each host once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from tensorxfer import _core
from tensorxfer.resharding.copy_services.planning import matching

#: Default bytes of one message (bucket) of a stream. Measured on the simulated cluster
#: (bench_refit_hosts.py --bucket, 2 Gbit/s NICs, Intel Xeon): 1 MiB keeps a NIC busy for
#: many small tensors (0.95-0.98x the NIC floor, against 0.84x with 4 MiB) and large ones
#: (weights 0.93-0.95x, replicas 1.05x the single-sender floor); without a rate limit
#: larger buckets cost less per byte (weights 187 ms at 1 MiB, 159 ms at 2 MiB).
DEFAULT_BUCKET_NBYTES = 1 << 20


@dataclass(frozen=True)
class Stream:
    """One stream: ``src`` sends its items to ``receivers[0]``, each receiver forwards to the next.

    ``rows[i, j]``: the matched row (index into the matched sends / receives) of item i's
    task to receivers[j]; ``sizes``: the messages' bytes. ``index`` is the stream's place in
    the plan's list, the same on every rank (its tag on the wire).
    """

    index: int
    src: int
    receivers: Tuple[int, ...]
    rows: np.ndarray
    sizes: np.ndarray

    @property
    def nbytes(self) -> int:
        return int(self.sizes.sum())

    def upstream_of(self, rank: int) -> int:
        """The rank a receiver gets the stream from."""
        position = self.receivers.index(rank)
        return self.src if position == 0 else self.receivers[position - 1]

    def downstream_of(self, rank: int) -> Optional[int]:
        """The rank ``rank`` (the sender or a receiver) passes the stream to, or None."""
        if rank == self.src:
            return self.receivers[0]
        position = self.receivers.index(rank)
        return self.receivers[position + 1] if position + 1 < len(self.receivers) else None


def source_keys(meta: np.ndarray, dims: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """FLAGS for the sends ``rows`` of the views (``describe_views``' meta and dims): a
    non-zero key shared by the sends that read the very same memory (address, itemsize,
    shape, strides), 0 for a source sent once. A key is 1 + the first such send's position."""
    keys = np.zeros(rows.size, np.int64)
    starts = np.concatenate(([0], np.cumsum(meta[:, 2].astype(np.int64))))
    first: Dict[Tuple[int, ...], int] = {}
    seen_twice = set()
    layouts: List[Tuple[int, ...]] = []
    for position, row in enumerate(rows.tolist()):
        address, itemsize, ndim = (int(value) for value in meta[row])
        start = int(starts[row])
        layout = (address, itemsize, *dims[start:start + ndim].reshape(-1).tolist())
        layouts.append(layout)
        if layout in first:
            seen_twice.add(layout)
        else:
            first[layout] = position
    for position, layout in enumerate(layouts):
        if layout in seen_twice:
            keys[position] = first[layout] + 1
    return keys


def plan_streams(sends: np.ndarray, host_of: Sequence[int], bucket_nbytes: int) -> List[Stream]:
    """Every stream of the tasks ``sends`` (matched rows, key order, every task crossing
    hosts), the same list on every rank (see the module docstring)."""
    host = np.asarray(host_of, np.int64)
    groups: Dict[Tuple[int, Tuple[int, ...]], List[List[int]]] = {}
    by_source: Dict[Tuple[int, int], List[int]] = {}
    for row in range(sends.shape[0]):
        src, key = int(sends[row, matching.SRC]), int(sends[row, matching.FLAGS])
        if key > 0:
            by_source.setdefault((src, key), []).append(row)
        else:
            groups.setdefault((src, (int(sends[row, matching.DST]),)), []).append([row])
    for (src, _), rows in by_source.items():
        receivers = [int(sends[row, matching.DST]) for row in rows]
        byte_counts = {int(sends[row, matching.NBYTES]) for row in rows}
        if len(set(receivers)) != len(receivers) or len(byte_counts) != 1:
            # Not one item for several receivers (the same memory sent twice to one rank,
            # or as different byte counts): each task on its own.
            for row in rows:
                groups.setdefault((src, (int(sends[row, matching.DST]),)), []).append([row])
            continue
        order = sorted(range(len(rows)), key=lambda i: (int(host[receivers[i]]), receivers[i]))
        chain = tuple(receivers[i] for i in order)
        groups.setdefault((src, chain), []).append([rows[i] for i in order])
    streams = []
    for index, ((src, chain), items) in enumerate(sorted(groups.items(), key=lambda entry: entry[0])):
        items.sort(key=lambda item: min(item))  # task order: the matched rows are in key order
        table = np.array(items, np.int64).reshape(len(items), len(chain))
        sizes = _core.message_sizes(sends[table[:, 0], matching.NBYTES].astype(np.uint64), bucket_nbytes)
        streams.append(Stream(index, src, chain, table, sizes))
    return streams


@dataclass(frozen=True)
class Role:
    """This rank's part in one stream: ``items`` are its local op indices (its sends'
    for the sender, its receives' for a receiver), ``upstream`` the rank it receives
    from (None: it is the sender), ``downstream`` the rank it sends to (None: the chain's end)."""

    stream: Stream
    items: np.ndarray
    upstream: Optional[int]
    downstream: Optional[int]


def roles_of(me: int, streams: Sequence[Stream], sends: np.ndarray, recvs: np.ndarray) -> List[Role]:
    """This rank's roles, in stream order."""
    roles = []
    for stream in streams:
        if stream.src == me:
            items = sends[stream.rows[:, 0], matching.LOCAL_INDEX]
            roles.append(Role(stream, items.astype(np.uint64), None, stream.receivers[0]))
        elif me in stream.receivers:
            column = stream.receivers.index(me)
            items = recvs[stream.rows[:, column], matching.LOCAL_INDEX]
            roles.append(Role(stream, items.astype(np.uint64), stream.upstream_of(me), stream.downstream_of(me)))
    return roles


def nic_bytes(streams: Sequence[Stream], host_of: Sequence[int]) -> Dict[int, Tuple[int, int]]:
    """Bytes each host's NIC sends and receives per run under these streams: {host: (out, in)}."""
    load: Dict[int, List[int]] = {}
    for stream in streams:
        hops = [stream.src, *stream.receivers]
        for a, b in zip(hops, hops[1:]):
            if host_of[a] != host_of[b]:
                load.setdefault(host_of[a], [0, 0])[0] += stream.nbytes
                load.setdefault(host_of[b], [0, 0])[1] += stream.nbytes
    return {host: (out, into) for host, (out, into) in load.items()}
