"""The run() shared by the backends that move bytes between processes (private).

A run: (1) same-rank pairs are matched (match_local_ops_by_task_id) and byte
sizes checked; (2) every rank all-gathers a digest of its remote ops and the
length of its local error if any (24 bytes: one fixed-size step; the error
texts follow only when a rank has one, the ranks' identities only in the
first run), so an error on one rank raises on all of them before any byte
moves; (3) when every digest equals the cached plan's,
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
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from tensorxfer import _core
from tensorxfer.errors import PeerLostError
from tensorxfer.ipc.pack import default_copy_engine
from tensorxfer.resharding.copy_services import _planning, _tensors
from tensorxfer.resharding.copy_services._liveness import PeerWatch, own_identity
from tensorxfer.resharding.copy_services._pattern import OpPattern, pattern_for
from tensorxfer.resharding.copy_services._queue import Columns, QueuedCopyService
from tensorxfer.resharding.copy_services.base import (
    DEFAULT_TIMEOUT,
    TaskMismatchError,
    check_timeout,
)

_UNSET: Any = object()
# Which collective step a metadata all-gather belongs to (with the run index, its identity).
_STEP_CONSTRUCTION, _STEP_AGREEMENT, _STEP_TABLES, _STEP_STATUS, _STEP_DIRECT_ADDRESSES = 1, 2, 3, 4, 5


def _positive(value: Any, argument: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{argument}: expected an integer >= 1, got {value!r}")
    return int(value)


class BatchedCopyService(QueuedCopyService):
    """Base of the multi-process backends: windows, coalescing, size agreement, plan reuse.

    ``timeout``: seconds a run waits for its peers (None = forever, still
    watching same-host peers and Ctrl-C). ``max_window_tasks`` /
    ``max_window_bytes`` bound a window; tasks under ``coalesce_bytes`` are
    packed per peer and window into one message.
    """

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
        self._plan: Optional[_planning.Plan] = None
        self._broken: Optional[str] = None
        self._agreed_error: Optional[BaseException] = None  # the last error every rank raised alike
        self._run_index = 0  # run() calls that reached the agreement, the same on every rank
        self._pattern: Optional[OpPattern] = None  # the last run's (see _pattern)
        self.plans_built = 0  # how many runs had to build their plan (the rest reused one)
        self._watch: Optional[PeerWatch] = None
        self._watch = self._agree_at_construction()

    def _plan_options(self) -> Dict[str, Optional[int]]:
        """The options that shape the plan: every rank must pass the same values."""
        return {"max_window_tasks": self.max_window_tasks, "max_window_bytes": self.max_window_bytes,
                "coalesce_bytes": self.coalesce_bytes}

    def _agree_at_construction(self) -> PeerWatch:
        """All-gathers the plan options and the ranks' identities: ValueError on every
        rank naming both values when an option differs; the PeerWatch otherwise."""
        options = self._plan_options()
        encoded = struct.pack(f"<{len(options)}q", *(-1 if value is None else value for value in options.values()))
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        gathered = self._all_gather(_STEP_CONSTRUCTION, encoded + own_identity(), deadline, self.timeout)
        mine = struct.unpack_from(f"<{len(options)}q", encoded)
        for rank, data in enumerate(gathered):
            theirs = struct.unpack_from(f"<{len(options)}q", data)
            for name, own_value, other_value in zip(options, mine, theirs):
                if own_value != other_value:
                    low, high = sorted((self.rank, rank))
                    values = {self.rank: own_value, rank: other_value}
                    shown = ["None" if values[r] == -1 else str(values[r]) for r in (low, high)]
                    raise ValueError(f"{self.backend_name}: {name} must be the same on every rank: rank {low} "
                                     f"passed {shown[0]}, rank {high} passed {shown[1]}")
        return PeerWatch([bytes(data[len(encoded):]) for data in gathered])

    # ---- transport (subclasses) -------------------------------------------------

    @abc.abstractmethod
    def _start_all_gather(self, data: bytes, fixed: bool = False) -> Tuple[List[Any], Callable[[], Any]]:
        """Starts gathering every rank's ``data``: (requests to wait on, a function
        returning the list of bytes by rank once they completed). May take
        several steps: the function may return further requests (see _all_gather).
        ``fixed``: every rank passes as many bytes (one step is enough)."""

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

    def close(self) -> None:
        """Release staging buffers and plans; later calls raise tensorxfer.ClosedError."""
        self._plan = None
        self._pattern = None
        super().close()

    # ---- run ------------------------------------------------------------------------

    def run(self, timeout: Optional[float] = _UNSET) -> None:
        """Execute every submitted op as one batch (collective: every rank calls it), then clear the queue.

        Raises TaskMismatchError (ops that do not pair up) or the error of a rank
        that could not take part (a bad tensor) on every rank, before any byte
        moves: the service stays usable. Any other failure (TimeoutError: a peer
        did not take part within the timeout; tensorxfer.PeerLostError: a peer
        died; a failed transfer or copy; KeyboardInterrupt) leaves this rank's
        peers unable to finish the batch, so the service cannot run again.
        """
        self._check_open("run")
        if self._broken is not None:
            raise RuntimeError(f"{self.backend_name}.run(): an earlier run failed ({self._broken}); close this service")
        timeout = self.timeout if timeout is _UNSET else check_timeout(timeout, f"{self.backend_name}.run")
        deadline = None if timeout is None else time.monotonic() + timeout
        sends, recvs = self._take_columns()
        try:
            self._run(sends, recvs, deadline, timeout)
        except BaseException as error:
            if error is not self._agreed_error:
                # Peers may be waiting on this rank, requests may still be posted into
                # user memory: this service cannot run again.
                self._broken = f"{type(error).__name__}: {error}"
                self._on_broken()
            raise
        finally:
            self._agreed_error = None

    def _on_broken(self) -> None:
        """Called once a run failed in a way the ranks did not agree on."""

    def _run(self, sends: Columns, recvs: Columns, deadline: Optional[float], timeout: Optional[float]) -> None:
        local_error: Optional[BaseException] = None
        digest = bytes(16)
        try:
            send_spans = _tensors.describe_many(sends[1])
            recv_spans = _tensors.describe_many(recvs[1])
            pattern = pattern_for(self._pattern, self.backend_name, self.rank, sends, recvs)
            # A pattern whose same-rank ops do not pair up is not kept (its error is raised anew).
            self._pattern = pattern if pattern.match_error is None else None
            local_error = pattern.local_error(send_spans.nbytes, recv_spans.nbytes)
            send_table, recv_table, digest = pattern.tables(send_spans.nbytes, recv_spans.nbytes,
                                                            self._send_flags(send_spans, pattern.sends.remote))
        except Exception as error:  # a tensor this rank cannot describe: agreed like a mismatch
            local_error = error
        digests = self._agree(digest, local_error, deadline, timeout)

        plan = self._plan
        if plan is None or plan.digests != digests:
            self._plan = None
            tables_data = self._all_gather(_STEP_TABLES, _planning.encode_tables(send_table, recv_table),
                                           deadline, timeout)
            tables = [_planning.decode_tables(data) for data in tables_data]
            try:
                plan = self._build_plan(tables, digests)
            except TaskMismatchError as error:  # every rank plans from the same tables: agreed
                self._agreed_error = error
                raise
            self._plan = plan
            self.plans_built += 1

        if pattern.pairs[0].size:
            self._copy_local(pattern.pairs, sends[1], recvs[1], send_spans, recv_spans)
        if plan.windows:
            send_tensors, send_spans = pattern.sends.remote_part(sends[1], send_spans)
            recv_tensors, recv_spans = pattern.recvs.remote_part(recvs[1], recv_spans)
            self._execute(plan, send_tensors, send_spans, recv_tensors, recv_spans, deadline, timeout)

    def _send_flags(self, spans: _tensors.Spans, rows: np.ndarray) -> Optional[np.ndarray]:
        """The FLAGS column for the sends ``spans[rows]`` (this rank's remote sends), or
        None for none. Backends whose plan depends on where a source lies override it."""
        return None

    def _build_plan(self, tables: List[Tuple[np.ndarray, np.ndarray]], digests: List[bytes]) -> Any:
        """This rank's plan from every rank's op tables; ``.windows`` is empty when it
        has no remote work. Backends with another transport plan their own way."""
        return _planning.build_plan(self.backend_name, self.rank, tables, digests, self.max_window_tasks,
                                    self.max_window_bytes, self.coalesce_bytes)

    def _agree(self, digest: bytes, local_error: Optional[BaseException], deadline: Optional[float],
               timeout: Optional[float]) -> List[bytes]:
        """Every rank's digest; raises this rank's local error, or TaskMismatchError naming
        the first rank that rejected the batch, on every rank alike (before any byte moves)."""
        self._run_index += 1
        errors = self._gather_errors(_STEP_AGREEMENT, local_error, digest, deadline, timeout)
        digests = [bytes(record[:16]) for record, _ in errors]
        failed = [(rank, text) for rank, (_, text) in enumerate(errors) if text]
        if local_error is not None:
            self._agreed_error = local_error
            raise local_error
        if failed:
            rank, text = failed[0]
            self._agreed_error = TaskMismatchError(f"{self.backend_name}: rank {rank} rejected the batch: {text}")
            raise self._agreed_error
        return digests

    def _agree_on_step(self, what: str, local_error: Optional[BaseException], deadline: Optional[float],
                       timeout: Optional[float]) -> None:
        """Tells every rank whether ``what`` failed on any rank: raises this rank's error,
        or RuntimeError naming the first rank that failed, on every rank alike."""
        errors = self._gather_errors(_STEP_STATUS, local_error, b"", deadline, timeout)
        if local_error is not None:
            raise local_error
        failed = [(rank, text) for rank, (_, text) in enumerate(errors) if text]
        if failed:
            rank, text = failed[0]
            raise RuntimeError(f"{self.backend_name}: rank {rank} failed {what}: {text}")

    def _gather_errors(self, step: int, local_error: Optional[BaseException], record: bytes,
                       deadline: Optional[float], timeout: Optional[float]) -> List[Tuple[bytes, str]]:
        """Every rank's fixed-size ``record`` and error text ("" for none): one fixed-size
        step, and the texts in a second one only when some rank has one."""
        message = b"" if local_error is None else (str(local_error) or type(local_error).__name__).encode()
        records = self._all_gather(step, record + struct.pack("<Q", len(message)), deadline, timeout, fixed=True)
        texts = [""] * len(records)
        if any(struct.unpack_from("<Q", data, len(record))[0] for data in records):
            texts = [bytes(data).decode(errors="replace")
                     for data in self._all_gather(step, message, deadline, timeout)]
        return [(bytes(data[:len(record)]), text) for data, text in zip(records, texts)]

    def _all_gather(self, step: int, data: bytes, deadline: Optional[float], timeout: Optional[float],
                    fixed: bool = False) -> List[bytes]:
        """Every rank's ``data``, each gathered with the identity of the operation it
        belongs to (the run and its step): a rank out of step raises RuntimeError."""
        header = struct.pack("<QQ", self._run_index, step)
        requests, finish = self._start_all_gather(header + data, fixed)
        while True:
            self._wait(requests, deadline, timeout, "the all-gather of the batch's metadata", None)
            result = finish()
            if isinstance(result, tuple):  # a further step
                requests, finish = result
                continue
            for rank, item in enumerate(result):
                if bytes(item[:16]) != header:
                    theirs = struct.unpack_from("<QQ", item) if len(item) >= 16 else ("?", "?")
                    raise RuntimeError(f"{self.backend_name}: ranks out of step: rank {self.rank} is at run "
                                       f"{self._run_index} step {step}, rank {rank} at run {theirs[0]} step {theirs[1]}")
            return [bytes(item[16:]) for item in result]

    # ---- local copies -----------------------------------------------------------------

    def _copy_local(self, pairs: Tuple[np.ndarray, np.ndarray], send_tensors: Sequence[Any],
                    recv_tensors: Sequence[Any], send_spans: _tensors.Spans, recv_spans: _tensors.Spans) -> None:
        """Copies each same-rank pair (send row, receive row): natively when both are
        contiguous host tensors, else through numpy / torch."""
        sources, targets = pairs
        moving = send_spans.nbytes[sources] != 0
        direct = (moving & send_spans.contiguous[sources] & recv_spans.contiguous[targets]
                  & send_spans.host[sources] & recv_spans.host[targets])
        for k in np.flatnonzero(moving & ~direct):
            i, j = int(sources[k]), int(targets[k])
            _tensors.copy_bytes_into(recv_tensors[j], _tensors.contiguous(send_tensors[i]))
        if direct.any():
            _tensors.copy_host_spans(send_spans.address[sources[direct]], recv_spans.address[targets[direct]],
                                     send_spans.nbytes[sources[direct]])

    # ---- remote windows -----------------------------------------------------------------

    def _staging(self, plan: _planning.Plan, kind: str, peer: int, nbytes: int, like: Any) -> Any:
        key = (kind, peer)
        buffer = plan.staging.get(key)
        if buffer is None:
            buffer = self._new_staging(nbytes, like)
            plan.staging[key] = buffer
        return buffer

    def _execute(self, plan: _planning.Plan, send_tensors: Sequence[Any], send_spans: _tensors.Spans,
                 recv_tensors: Sequence[Any], recv_spans: _tensors.Spans, deadline: Optional[float],
                 timeout: Optional[float]) -> None:
        """Moves the remote ops (tensors and spans in the order of the plan's local indices)."""
        engine = default_copy_engine()
        # Sources as they are now (after the caller's writes): non-contiguous ones copied once.
        send_objects = list(send_tensors)
        send_addresses = send_spans.address.copy()
        for i in np.flatnonzero(~send_spans.contiguous):
            send_objects[i] = _tensors.contiguous(send_objects[i])
            send_addresses[i] = _tensors.describe(send_objects[i]).address
        # Destinations as the transport and the unpacker see them: non-contiguous ones
        # are received into contiguous staging, copied back after the last window.
        recv_targets = list(recv_tensors)
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


def _torch_from(array: np.ndarray) -> Any:
    import torch

    return torch.from_numpy(array)
