"""Moving a plan's windows as messages: the mover of the mpi and torch backends (private).

The run protocol (_run_protocol) agrees on the batch and reuses the plan; a
:class:`MessageExecutor` plans with the shared steps (matching, windows,
coalescing) and moves the plan's windows one after the other: post the
receives, pack small tasks per peer (natively, GIL released), post the sends,
wait for all of them under the deadline while watching peers, unpack and copy
staged receives back.

It holds the backend's :class:`MessageTransport`: an all-gather of bytes in
non-blocking steps, staging buffers, non-blocking sends and receives of byte
ranges, and a wait.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Dict, List, Optional, Protocol, Sequence, Tuple

import numpy as np

from tensorxfer import _core
from tensorxfer.errors import PeerLostError
from tensorxfer.resharding._copy_engine import resharding_copy_engine
from tensorxfer.resharding.copy_services import _tensors, planning
from tensorxfer.resharding.copy_services.planning import coalescing
from tensorxfer.resharding.copy_services._liveness import PeerWatch
from tensorxfer.resharding.copy_services._network_plan import DEFAULT_BUCKET_NBYTES
from tensorxfer.resharding.copy_services._run_protocol import RunProtocol
from tensorxfer.resharding.copy_services.base import check_timeout
from tensorxfer._arguments import check_int

# One message as the transport posts it: (peer, tag, contiguous tensor, address, nbytes).
Posting = Tuple[int, int, Any, int, int]


class MessageTransport(Protocol):
    """What a message backend provides (mpi4py, torch.distributed)."""

    def start_all_gather(self, data: bytes, fixed: bool = False) -> Tuple[List[Any], Callable[[], Any]]:
        """Starts gathering every rank's ``data``: (requests to wait on, a function
        returning the list of bytes by rank once they completed, or a further
        (requests, function) step). ``fixed``: every rank passes as many bytes."""

    def new_staging(self, nbytes: int, like: Any) -> Any:
        """A contiguous uint8 buffer of nbytes on the device of ``like`` (a user tensor)."""

    def post(self, sends: Sequence[Posting], recvs: Sequence[Posting]) -> List[Any]:
        """Posts receives then sends of one window (the message being the first
        nbytes of each tensor); returns requests."""

    def wait(self, requests: List[Any], deadline: Optional[float], timeout: Optional[float], what: str,
             peers: Optional[List[int]]) -> None:
        """Returns once every request completed; TimeoutError at the deadline,
        PeerLostError when a peer died (see :func:`poll_until_done`)."""


class MessageExecutor:
    """The run protocol's mover for a message transport (see the module docstring).

    ``max_window_tasks`` / ``max_window_bytes`` bound a window; tasks under
    ``coalesce_bytes`` are packed per peer and window into one message.
    ``bucket_nbytes`` is the message size of persistent plans between hosts
    (_network_plan), held here so that every rank is checked to pass the same.
    """

    def __init__(self, backend_name: str, rank: int, transport: MessageTransport, *,
                 max_window_tasks: int = 65536, max_window_bytes: int = 256 << 20,
                 coalesce_bytes: int = 128 << 10, bucket_nbytes: int = DEFAULT_BUCKET_NBYTES) -> None:
        self.backend_name = backend_name
        self.rank = rank
        self.transport = transport
        self.max_window_tasks = check_int(max_window_tasks, "max_window_tasks", minimum=1)
        self.max_window_bytes = check_int(max_window_bytes, "max_window_bytes", minimum=1)
        self.coalesce_bytes = check_int(coalesce_bytes, "coalesce_bytes", minimum=1)
        self.bucket_nbytes = check_int(bucket_nbytes, "bucket_nbytes", minimum=1)

    def plan_options(self) -> Dict[str, Optional[int]]:
        """The options that shape the plan: every rank must pass the same values."""
        return {"max_window_tasks": self.max_window_tasks, "max_window_bytes": self.max_window_bytes,
                "coalesce_bytes": self.coalesce_bytes, "bucket_nbytes": self.bucket_nbytes}

    def gather(self, data: bytes, fixed: bool, deadline: Optional[float], timeout: Optional[float]) -> List[bytes]:
        """The run protocol's all-gather, on the transport's non-blocking steps."""
        requests, finish = self.transport.start_all_gather(data, fixed)
        while True:
            self.transport.wait(requests, deadline, timeout, "the all-gather of the batch's metadata", None)
            result = finish()
            if not isinstance(result, tuple):
                return result
            requests, finish = result  # a further step

    def send_flags(self, spans: _tensors.Spans, rows: np.ndarray) -> Optional[np.ndarray]:
        return None  # the plan does not depend on where a source lies

    def build_plan(self, tables: List[Tuple[np.ndarray, np.ndarray]], digests: List[bytes]) -> coalescing.Plan:
        return planning.build_plan(self.backend_name, self.rank, tables, digests, self.max_window_tasks,
                                   self.max_window_bytes, self.coalesce_bytes)

    def execute(self, plan: coalescing.Plan, send_tensors: Sequence[Any], send_spans: _tensors.Spans,
                 recv_tensors: Sequence[Any], recv_spans: _tensors.Spans, deadline: Optional[float],
                 timeout: Optional[float]) -> None:
        """Moves the remote ops (tensors and spans in the order of the plan's local indices)."""
        engine = resharding_copy_engine()
        send_objects, send_addresses = _tensors.sources_as_now(send_tensors, send_spans)
        recv_targets, recv_addresses, pending = _tensors.staged_targets(recv_tensors, recv_spans)
        all_host = bool(send_spans.host.all() and recv_spans.host.all())
        for window in plan.windows:
            posted_recvs: List[Posting] = []
            posted_sends: List[Posting] = []
            after: List[Tuple[coalescing.PackedMessage, Any]] = []
            for message in window.recvs_packed:
                if message.tag < 0:
                    continue
                like = recv_tensors[int(message.local_indices[0])]
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
                    _pack_with_torch(buffer, [send_objects[int(i)] for i in message.local_indices])
                posted_sends.append((message.peer, message.tag, buffer, _tensors.describe(buffer).address, message.total))
            for single in window.sends_single:
                posted_sends.append((single.peer, single.tag, send_objects[single.local_index],
                                     int(send_addresses[single.local_index]), single.nbytes))
            requests = self.transport.post(posted_sends, posted_recvs)
            peers = sorted({item[0] for item in posted_sends} | {item[0] for item in posted_recvs})
            self.transport.wait(requests, deadline, timeout, "the batch's transfers", peers)
            for message, buffer in after:
                if all_host:
                    _core.unpack_spans(buffer, recv_addresses[message.local_indices], message.nbytes, engine)
                else:
                    _unpack_with_torch(buffer, [recv_targets[int(i)] for i in message.local_indices], message.nbytes)
        _tensors.copy_back(pending)

    def _staging(self, plan: coalescing.Plan, kind: str, peer: int, nbytes: int, like: Any) -> Any:
        buffer = plan.staging.get((kind, peer))
        if buffer is None:
            buffer = self.transport.new_staging(nbytes, like)
            plan.staging[(kind, peer)] = buffer
        return buffer


def message_run(backend_name: str, rank: int, world_size: int, transport: Any, timeout: Any,
                options: Dict[str, Any]) -> RunProtocol:
    """The run of a message backend (mpi, torch): a RunProtocol whose mover is a
    MessageExecutor over ``transport`` (``options``: the window options). Collective:
    the ranks compare the options; the transport then watches the peers."""
    timeout = check_timeout(timeout, f"{backend_name}(timeout=...)")
    messages = MessageExecutor(backend_name, rank, transport, **options)
    protocol = RunProtocol(backend_name, rank, world_size, messages.gather, messages.plan_options(), timeout)
    protocol.mover = messages
    transport.watch = protocol.watch
    return protocol


def poll_until_done(test_all: Callable[[List[Any]], bool], abandon: Callable[[List[Any]], None],
                    requests: List[Any], watch: Optional[PeerWatch], backend: str, rank: int, world_size: int,
                    deadline: Optional[float], timeout: Optional[float], what: str, peers: Optional[List[int]]) -> None:
    """Polls ``test_all(requests)`` until it is true: spins briefly, then sleeps (so
    signals are handled and the peer gets the CPU); abandons the requests and raises
    TimeoutError at the deadline, PeerLostError when a same-host peer died."""
    started = time.monotonic()
    next_liveness = started + 0.02
    nap = 0.0
    while not test_all(requests):
        now = time.monotonic()
        if now >= next_liveness:
            next_liveness = now + 0.02
            for peer in (peers if peers is not None else range(world_size)):
                if peer != rank and watch is not None and watch.is_dead(peer):
                    abandon(requests)
                    raise PeerLostError(f"{backend}: rank {peer} died during {what} (rank {rank})")
        if deadline is not None and now >= deadline:
            abandon(requests)
            waiting_on = "every rank" if peers is None else f"ranks {peers}"
            raise TimeoutError(f"{backend}: rank {rank} waited {timeout:g} s for {what} with {waiting_on}; "
                               "a peer did not call run() or stalled")
        # Poll without pausing for the first 2 ms (a transfer in progress needs
        # this rank's calls to advance), then nap 50 us growing to 1 ms.
        if now - started > 0.002:
            nap = min(0.001, nap * 1.5 if nap else 0.00005)
            time.sleep(nap)


def _pack_with_torch(buffer: Any, sources: List[Any]) -> None:
    import torch

    offset = 0
    for source in sources:
        flat = _tensors.flat_bytes(source)
        count = int(flat.shape[0])
        buffer[offset:offset + count].copy_(flat if not isinstance(flat, np.ndarray) else torch.from_numpy(flat))
        offset += count


def _unpack_with_torch(buffer: Any, targets: List[Any], nbytes: np.ndarray) -> None:
    offset = 0
    for target, count in zip(targets, nbytes):
        count = int(count)
        _tensors.copy_bytes_into(target, buffer[offset:offset + count])
        offset += count
