"""The run() shared by the backends that move bytes between processes (private).

A run: (1) same-rank pairs are matched (match_local_ops_by_task_id) and byte
sizes checked; (2) every rank all-gathers a digest of its remote ops, its
identity and its local error if any, so an error on one rank raises on all of
them before any byte moves; (3) when every digest equals the cached plan's,
the plan (windows, messages, staging buffers) is reused, else all ranks
all-gather their op tables and build it (see _planning); (4) local copies;
(5) windows one after the other: post receives, pack small tasks per peer
(natively, GIL released), post sends, wait for all of them under the deadline
while watching peers, unpack and copy staged receives back.

Subclasses provide the transport: an all-gather of bytes, staging buffers,
non-blocking sends and receives of byte ranges, and a completion test.
"""

from __future__ import annotations

import abc
import struct
import time
from typing import Any, Callable, List, Optional, Sequence, Tuple

import numpy as np

from tensorxfer import _core
from tensorxfer.errors import PeerLostError
from tensorxfer.ipc.pack import default_copy_engine
from tensorxfer.resharding.copy_services import _planning, _tensors
from tensorxfer.resharding.copy_services._liveness import PeerWatch, own_identity
from tensorxfer.resharding.copy_services.base import (
    DEFAULT_TIMEOUT,
    CopyService,
    RecvOp,
    SendOp,
    TaskMismatchError,
    check_rank,
    check_task_id,
    check_timeout,
    match_local_ops_by_task_id,
)

_UNSET: Any = object()


class _LocalOp:
    """A same-rank op for match_local_ops_by_task_id: task id + position in the queue."""

    __slots__ = ("task_id", "index")

    def __init__(self, task_id: Optional[int], index: int) -> None:
        self.task_id = task_id
        self.index = index


def _positive(value: Any, argument: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{argument}: expected an integer >= 1, got {value!r}")
    return int(value)


class BatchedCopyService(CopyService):
    """Base of the multi-process backends: windows, coalescing, size agreement, plan reuse.

    ``timeout``: seconds a run waits for its peers (None = forever, still
    watching same-host peers and Ctrl-C). ``max_window_tasks`` /
    ``max_window_bytes`` bound a window; tasks under ``coalesce_bytes`` are
    packed per peer and window into one message.
    """

    host_only = True  # the transport moves host memory only

    def __init__(
        self,
        group: Any = None,
        *,
        timeout: Optional[float] = DEFAULT_TIMEOUT,
        max_window_tasks: int = 65536,
        max_window_bytes: int = 256 << 20,
        coalesce_bytes: int = 128 << 10,
    ) -> None:
        super().__init__(group)
        self.timeout = check_timeout(timeout, f"{self.backend_name}(timeout=...)")
        self.max_window_tasks = _positive(max_window_tasks, "max_window_tasks")
        self.max_window_bytes = _positive(max_window_bytes, "max_window_bytes")
        self.coalesce_bytes = _positive(coalesce_bytes, "coalesce_bytes")
        self._world = self.world_size
        self._plan: Optional[_planning.Plan] = None
        self._broken: Optional[str] = None
        self._watch: Optional[PeerWatch] = None
        self.plans_built = 0  # how many runs had to build their plan (the rest reused one)

    # ---- transport (subclasses) -------------------------------------------------

    @abc.abstractmethod
    def _start_all_gather(self, data: bytes) -> Tuple[List[Any], Callable[[], List[bytes]]]:
        """Starts gathering every rank's ``data``: (requests to wait on, a function
        returning the list of bytes by rank once they completed). May take
        several steps: the function may return further requests (see _all_gather)."""

    @abc.abstractmethod
    def _new_staging(self, nbytes: int, like: Any) -> Any:
        """A contiguous uint8 buffer of nbytes on the device of ``like`` (a user tensor)."""

    @abc.abstractmethod
    def _post(self, sends: Sequence[Tuple[int, int, Any, int, int]],
              recvs: Sequence[Tuple[int, int, Any, int, int]]) -> List[Any]:
        """Posts receives then sends of one window, each (peer, tag, contiguous tensor,
        address, nbytes), the message being the first nbytes of the tensor; returns requests."""

    @abc.abstractmethod
    def _test_all(self, requests: List[Any]) -> bool:
        """True when every request completed; raises the transport's error if one failed."""

    def _abandon(self, requests: List[Any]) -> None:
        """Best-effort cancellation of requests left pending by a failed run."""

    # ---- submission ----------------------------------------------------------------
    # Submits only check their arguments (the per-op cost of a step of 10,000
    # tensors); addresses and sizes are read in bulk, natively, by run().

    def submit_send(self, src_tensor: Any, dest_rank: int, task_id: Optional[int] = None) -> None:
        """Queue ``src_tensor`` to be sent to ``dest_rank``; its bytes are read during run()."""
        if self._closed:
            self._check_open("submit_send")
        tensor = _tensors.normalize_fast(src_tensor, "src_tensor", False, self.host_only, self.backend_name)
        if type(dest_rank) is not int or not 0 <= dest_rank < self._world:
            dest_rank = check_rank(dest_rank, self._world, "dest_rank")
        if task_id is not None and (type(task_id) is not int or not -(2**63) <= task_id < 2**63):
            task_id = check_task_id(task_id)
        self.send_ops.append(SendOp(task_id, tensor, dest_rank))

    def submit_recv(self, dest_tensor: Any, src_rank: int, task_id: Optional[int] = None) -> None:
        """Queue ``dest_tensor`` to receive from ``src_rank`` (any layout: staged if not contiguous)."""
        if self._closed:
            self._check_open("submit_recv")
        tensor = _tensors.normalize_fast(dest_tensor, "dest_tensor", True, self.host_only, self.backend_name)
        if type(src_rank) is not int or not 0 <= src_rank < self._world:
            src_rank = check_rank(src_rank, self._world, "src_rank")
        if task_id is not None and (type(task_id) is not int or not -(2**63) <= task_id < 2**63):
            task_id = check_task_id(task_id)
        self.recv_ops.append(RecvOp(task_id, tensor, src_rank))

    def close(self) -> None:
        """Release staging buffers and plans; later calls raise RuntimeError."""
        self._plan = None
        super().close()

    # ---- run ------------------------------------------------------------------------

    def run(self, timeout: Optional[float] = _UNSET) -> None:
        """Execute every submitted op as one batch (collective: every rank calls it), then clear the queue.

        Raises TaskMismatchError (ops that do not pair up, on every rank),
        TimeoutError (a peer did not take part within the timeout) or
        tensorxfer.PeerLostError (a peer died). After a TimeoutError,
        PeerLostError or KeyboardInterrupt the service cannot run again.
        """
        self._check_open("run")
        if self._broken is not None:
            raise RuntimeError(f"{self.backend_name}.run(): an earlier run failed ({self._broken}); close this service")
        timeout = self.timeout if timeout is _UNSET else check_timeout(timeout, f"{self.backend_name}.run")
        deadline = None if timeout is None else time.monotonic() + timeout
        sends, recvs = self._take_ops()
        try:
            self._run(sends, recvs, deadline, timeout)
        except (TimeoutError, PeerLostError, KeyboardInterrupt) as error:
            # Requests may still be posted into user memory: this service cannot run again.
            self._broken = f"{type(error).__name__}: {error}"
            raise

    def _run(self, sends: List[SendOp], recvs: List[RecvOp], deadline: Optional[float],
             timeout: Optional[float]) -> None:
        me = self.rank
        send_spans = _tensors.describe_many([op.tensor for op in sends])
        recv_spans = _tensors.describe_many([op.tensor for op in recvs])
        send_peers = np.fromiter((op.dest_rank for op in sends), np.int64, len(sends))
        recv_peers = np.fromiter((op.src_rank for op in recvs), np.int64, len(recvs))
        local_sends = [_LocalOp(sends[i].task_id, int(i)) for i in np.flatnonzero(send_peers == me)]
        local_recvs = [_LocalOp(recvs[i].task_id, int(i)) for i in np.flatnonzero(recv_peers == me)]
        local_error: Optional[Exception] = None
        pairs: List[Tuple[_LocalOp, _LocalOp]] = []
        try:
            pairs = match_local_ops_by_task_id(local_sends, local_recvs, self.backend_name, me)
            for send, recv in pairs:
                sent, received = int(send_spans.nbytes[send.index]), int(recv_spans.nbytes[recv.index])
                if sent != received:
                    raise TaskMismatchError(
                        f"{self.backend_name}: size mismatch for task_id={send.task_id} on rank {me}: "
                        f"the local send has {sent} bytes, the local recv {received} bytes"
                    )
        except RuntimeError as error:
            local_error = error
        remote_sends = np.flatnonzero(send_peers != me)
        remote_recvs = np.flatnonzero(recv_peers != me)
        if remote_sends.size == len(sends):
            send_ids = [op.task_id for op in sends]
        else:
            send_ids = [sends[i].task_id for i in remote_sends]
        if remote_recvs.size == len(recvs):
            recv_ids = [op.task_id for op in recvs]
        else:
            recv_ids = [recvs[i].task_id for i in remote_recvs]
        send_table = _planning.op_table(send_ids, np.full(remote_sends.size, me), send_peers[remote_sends],
                                        send_spans.nbytes[remote_sends],
                                        self._send_flags(send_spans, remote_sends))
        recv_table = _planning.op_table(recv_ids, recv_peers[remote_recvs], np.full(remote_recvs.size, me),
                                        recv_spans.nbytes[remote_recvs])
        digest = _planning.digest(send_table, recv_table)

        # One small all-gather per run: digests, identities, errors.
        identity = own_identity()
        message = b"" if local_error is None else str(local_error).encode()
        payload = digest + struct.pack("<I", len(identity)) + identity + message
        gathered = self._all_gather(payload, deadline, timeout)
        digests, identities, errors = [], [], []
        for data in gathered:
            (length,) = struct.unpack_from("<I", data, 16)
            digests.append(bytes(data[:16]))
            identities.append(bytes(data[20:20 + length]))
            errors.append(bytes(data[20 + length:]).decode(errors="replace"))
        self._watch = PeerWatch(identities)
        if local_error is not None:
            raise local_error
        failed = [(rank, text) for rank, text in enumerate(errors) if text]
        if failed:
            rank, text = failed[0]
            raise TaskMismatchError(f"{self.backend_name}: rank {rank} rejected the batch: {text}")

        plan = self._plan
        if plan is None or plan.digests != digests:
            self._plan = None
            tables_data = self._all_gather(_planning.encode_tables(send_table, recv_table), deadline, timeout)
            tables = [_planning.decode_tables(data) for data in tables_data]
            plan = self._build_plan(tables, digests)
            self._plan = plan
            self.plans_built += 1

        self._copy_local(pairs, sends, recvs, send_spans, recv_spans)
        if plan.windows:
            self._execute(plan, [sends[i] for i in remote_sends], _subset(send_spans, remote_sends),
                          [recvs[i] for i in remote_recvs], _subset(recv_spans, remote_recvs), deadline, timeout)

    def _send_flags(self, spans: _tensors.Spans, rows: np.ndarray) -> Optional[np.ndarray]:
        """The FLAGS column for the sends ``spans[rows]`` (this rank's remote sends), or
        None for none. Backends whose plan depends on where a source lies override it."""
        return None

    def _build_plan(self, tables: List[Tuple[np.ndarray, np.ndarray]], digests: List[bytes]) -> Any:
        """This rank's plan from every rank's op tables; ``.windows`` is empty when it
        has no remote work. Backends with another transport plan their own way."""
        return _planning.build_plan(self.backend_name, self.rank, tables, digests, self.max_window_tasks,
                                    self.max_window_bytes, self.coalesce_bytes)

    def _all_gather(self, data: bytes, deadline: Optional[float], timeout: Optional[float]) -> List[bytes]:
        requests, finish = self._start_all_gather(data)
        while True:
            self._wait(requests, deadline, timeout, "the all-gather of the batch's metadata", None)
            result = finish()
            if isinstance(result, tuple):  # a further step
                requests, finish = result
                continue
            return result

    # ---- local copies -----------------------------------------------------------------

    def _copy_local(self, pairs: List[Tuple[_LocalOp, _LocalOp]], sends: List[SendOp], recvs: List[RecvOp],
                    send_spans: _tensors.Spans, recv_spans: _tensors.Spans) -> None:
        fast_src: List[int] = []
        fast_dst: List[int] = []
        fast_nbytes: List[int] = []
        for send, recv in pairs:
            i, j = send.index, recv.index
            if send_spans.nbytes[i] == 0:
                continue
            if send_spans.contiguous[i] and recv_spans.contiguous[j] and send_spans.host[i] and recv_spans.host[j]:
                fast_src.append(send_spans.address[i])
                fast_dst.append(recv_spans.address[j])
                fast_nbytes.append(send_spans.nbytes[i])
            else:
                _tensors.copy_bytes_into(recvs[j].tensor, _tensors.contiguous(sends[i].tensor))
        if fast_nbytes:
            _tensors.copy_host_spans(fast_src, fast_dst, fast_nbytes)

    # ---- remote windows -----------------------------------------------------------------

    def _staging(self, plan: _planning.Plan, kind: str, peer: int, nbytes: int, like: Any) -> Any:
        key = (kind, peer)
        buffer = plan.staging.get(key)
        if buffer is None:
            buffer = self._new_staging(nbytes, like)
            plan.staging[key] = buffer
        return buffer

    def _execute(self, plan: _planning.Plan, send_ops: List[SendOp], send_spans: _tensors.Spans,
                 recv_ops: List[RecvOp], recv_spans: _tensors.Spans, deadline: Optional[float],
                 timeout: Optional[float]) -> None:
        engine = default_copy_engine()
        # Sources as they are now (after the caller's writes): non-contiguous ones copied once.
        send_objects = [op.tensor for op in send_ops]
        send_addresses = send_spans.address.copy()
        for i in np.flatnonzero(~send_spans.contiguous):
            send_objects[i] = _tensors.contiguous(send_objects[i])
            send_addresses[i] = _tensors.describe(send_objects[i]).address
        # Destinations as the transport and the unpacker see them: non-contiguous ones
        # are received into contiguous staging, copied back after the last window.
        recv_targets = [op.tensor for op in recv_ops]
        recv_addresses = recv_spans.address.copy()
        copy_back: List[Tuple[Any, Any]] = []
        for i in np.flatnonzero(~recv_spans.contiguous):
            staged = _tensors.empty_like(recv_targets[i])
            copy_back.append((recv_targets[i], staged))
            recv_targets[i] = staged
            recv_addresses[i] = _tensors.describe(staged).address
        all_host = bool(send_spans.host.all() and recv_spans.host.all())

        for window in plan.windows:
            posted_recvs: List[Tuple[int, int, Any, int, int]] = []
            posted_sends: List[Tuple[int, int, Any, int, int]] = []
            after: List[Tuple[_planning.PackedMessage, Any]] = []
            for message in window.recvs_packed:
                if message.tag < 0:
                    continue
                like = recv_ops[int(message.local_indices[0])].tensor
                buffer = self._staging(plan, "recv", message.peer, plan.max_recv_packed[message.peer], like)
                posted_recvs.append((message.peer, message.tag, buffer, _tensors.describe(buffer).address, message.total))
                after.append((message, buffer))
            for single in window.recvs_single:
                posted_recvs.append((single.peer, single.tag, recv_targets[single.local_index],
                                     int(recv_addresses[single.local_index]), single.nbytes))
            for message in window.sends_packed:
                if message.tag < 0:
                    continue
                like = send_objects[int(message.local_indices[0])]
                buffer = self._staging(plan, "send", message.peer, plan.max_send_packed[message.peer], like)
                if all_host:
                    _core.pack_spans(buffer, send_addresses[message.local_indices], message.nbytes, engine)
                else:
                    self._pack_with_torch(buffer, [send_objects[int(i)] for i in message.local_indices])
                posted_sends.append((message.peer, message.tag, buffer, _tensors.describe(buffer).address, message.total))
            for single in window.sends_single:
                posted_sends.append((single.peer, single.tag, send_objects[single.local_index],
                                     int(send_addresses[single.local_index]), single.nbytes))
            requests = self._post(posted_sends, posted_recvs)
            peers = sorted({item[0] for item in posted_sends} | {item[0] for item in posted_recvs})
            self._wait(requests, deadline, timeout, "the batch's transfers", peers)
            for message, buffer in after:
                if all_host:
                    _core.unpack_spans(buffer, recv_addresses[message.local_indices], message.nbytes, engine)
                else:
                    self._unpack_with_torch(buffer, [recv_targets[int(i)] for i in message.local_indices],
                                            message.nbytes)
        for target, staged in copy_back:
            _tensors.copy_bytes_into(target, staged)

    @staticmethod
    def _pack_with_torch(buffer: Any, sources: List[Any]) -> None:
        offset = 0
        for source in sources:
            flat = _tensors.flat_bytes(source)
            count = int(flat.shape[0])
            buffer[offset:offset + count].copy_(flat if not isinstance(flat, np.ndarray) else _torch_from(flat))
            offset += count

    @staticmethod
    def _unpack_with_torch(buffer: Any, targets: List[Any], nbytes: np.ndarray) -> None:
        offset = 0
        for target, count in zip(targets, nbytes):
            count = int(count)
            _tensors.copy_bytes_into(target, buffer[offset:offset + count])
            offset += count

    # ---- waiting ----------------------------------------------------------------------------

    def _wait(self, requests: List[Any], deadline: Optional[float], timeout: Optional[float], what: str,
              peers: Optional[List[int]]) -> None:
        """Polls until every request completed: spins briefly, then sleeps (so signals are
        handled and the peer gets the CPU); raises TimeoutError at the deadline and
        PeerLostError when a same-host peer died."""
        started = time.monotonic()
        next_liveness = started + 0.02
        nap = 0.0
        while not self._test_all(requests):
            now = time.monotonic()
            if now >= next_liveness:
                next_liveness = now + 0.02
                watch = self._watch
                for peer in (peers if peers is not None else range(self.world_size)):
                    if peer != self.rank and watch is not None and watch.is_dead(peer):
                        self._abandon(requests)
                        raise PeerLostError(f"{self.backend_name}: rank {peer} died during {what} (rank {self.rank})")
            if deadline is not None and now >= deadline:
                self._abandon(requests)
                waiting_on = "every rank" if peers is None else f"ranks {peers}"
                raise TimeoutError(
                    f"{self.backend_name}: rank {self.rank} waited {timeout:g} s for {what} with {waiting_on}; "
                    "a peer did not call run() or stalled"
                )
            # Poll without pausing for the first 2 ms (a transfer in progress needs
            # this rank's calls to advance), then nap 50 us growing to 1 ms.
            if now - started > 0.002:
                nap = min(0.001, nap * 1.5 if nap else 0.00005)
                time.sleep(nap)


def _subset(spans: _tensors.Spans, rows: np.ndarray) -> _tensors.Spans:
    return _tensors.Spans(spans.address[rows], spans.nbytes[rows], spans.contiguous[rows], spans.host[rows])


def _torch_from(array: np.ndarray) -> Any:
    import torch

    return torch.from_numpy(array)
