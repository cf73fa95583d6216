"""What a rank's ops raise after a failure: the lost rank named, wherever it was.

A rank of this host that died is seen directly (the local group's liveness).
A rank elsewhere is named through the store: the first rank that sees a peer
die publishes it, and ranks whose op failed for another reason (gloo's
connection closed, a local peer that gave up) look it up for a moment. The
store may live in a rank (``tcp://`` init: rank 0) that fails too, so a failed
rank leaves only once every other survivor has read the name
(:meth:`FailureReporter.wait_until_read`, bounded).
"""

from __future__ import annotations

import time
from typing import Any, Callable, List, Optional

from tensorxfer.distributed.topology import Topology
from tensorxfer.errors import PeerLostError

FAILURE_KEY = "failure/dead-rank"
#: How many ranks have read (or published) FAILURE_KEY.
ACK_KEY = "failure/acknowledged"
#: How long a failed rank waits for another rank to publish who died.
LOOKUP_S = 1.0


class FailureReporter:
    """Handles an op's failure (:meth:`on_op_failure`): the error every waiter gets, naming the lost rank."""

    def __init__(self, store: Any, topology: Topology, group: Any, release: Callable[[], None]) -> None:
        self._store = store
        self._topology = topology
        self._group = group
        self._release = release
        self._named: Optional[str] = None  # the rank this rank's failure named

    def _dead_local_ranks(self) -> List[int]:
        try:
            local = self._topology.local_ranks
            return [local[r] for r in range(len(local)) if not self._group.rank_alive(r)]
        except Exception:  # noqa: BLE001 - the group itself may be closed already
            return []

    def _published(self, wait_s: float) -> Optional[str]:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                if self._store.check([FAILURE_KEY]):
                    return bytes(self._store.get(FAILURE_KEY)).decode()
            except Exception:  # noqa: BLE001 - the store's host may be the dead rank
                return None
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.02)

    def _publish(self, rank: int) -> None:
        try:  # first writer wins: later ones may see a rank that only gave up
            self._store.compare_set(FAILURE_KEY, "", str(rank))
        except Exception:  # noqa: BLE001
            pass

    def raise_if_published(self) -> None:
        """Raises PeerLostError when some rank published a failure (for waits that cannot see it themselves)."""
        lost = self._published(0.0)
        if lost is not None:
            raise PeerLostError(f"rank {lost} failed while this rank waited for the cross-host step")

    def _acknowledge(self) -> None:
        try:
            self._store.add(ACK_KEY, 1)
        except Exception:  # noqa: BLE001
            pass

    def wait_until_read(self, wait_s: float) -> None:
        """After a failure that named a rank: waits (at most ``wait_s``) until every rank but one has read it."""
        if self._named is None:
            return
        world_size = sum(len(ranks) for ranks in self._topology.hosts)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            try:
                if self._store.add(ACK_KEY, 0) >= world_size - 1:
                    return
            except Exception:  # noqa: BLE001 - the store is gone: nobody can read it any more
                return
            time.sleep(0.02)

    def on_op_failure(self, op: str, error: BaseException) -> BaseException:
        """Handles the failure of ``op``: names the lost rank (:meth:`_name_lost_rank`), releases this
        host's shared memory (its ranks blocked on this one notice at once) and returns the error every
        waiter gets (:meth:`_error_for`). A KeyboardInterrupt is returned as it is."""
        if isinstance(error, KeyboardInterrupt):
            return error
        lost = self._name_lost_rank()
        self._release()
        return self._error_for(op, error, lost)

    def _name_lost_rank(self) -> Optional[str]:
        """The rank that died, if any is known: published by another rank, else a rank of this host seen
        dead (published here), else published within :data:`LOOKUP_S`. A name read is acknowledged."""
        lost = self._published(0.0)
        if lost is None:
            dead = self._dead_local_ranks()
            if dead:
                self._publish(dead[0])
                lost = self._published(0.0) or str(dead[0])
            else:
                lost = self._published(LOOKUP_S)
        if lost is not None:
            self._named = lost
            self._acknowledge()
        return lost

    def _error_for(self, op: str, error: BaseException, lost: Optional[str]) -> BaseException:
        rank = self._topology.rank
        if lost is not None:
            return PeerLostError(f"tensorxfer backend: {op} on rank {rank} failed: rank {lost} died "
                                 f"or left the process group ({type(error).__name__}: {error})")
        if isinstance(error, TimeoutError):
            return TimeoutError(f"tensorxfer backend: {op} on rank {rank} failed with a timeout ({error})")
        if isinstance(error, (PeerLostError, ValueError, TypeError)):
            return type(error)(f"tensorxfer backend: {op} on rank {rank} failed: {error}")
        return error
