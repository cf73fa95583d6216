"""The run protocol every copy service that moves bytes between processes holds (private).

A run: (1) same-rank pairs are matched (match_local_ops_by_task_id) and byte
sizes checked; (2) every rank all-gathers a digest of its remote ops and the
length of its local error if any (one fixed-size step; the error texts follow
only when a rank has one), so an error on one rank raises on all of them before
any byte moves; (3) when every digest equals the cached plan's, the plan is
reused (planning.plan_cache), else all ranks all-gather their op tables and the
backend plans; (4) local copies; (5) the backend moves the remote ops.

Every metadata all-gather carries the identity of the operation it belongs to
(the run's index and the step), so a rank out of step raises instead of
completing a peer's pending step. A failure the ranks did not agree on breaks
the service: it cannot run again.

A backend builds a :class:`RunProtocol` from its transport's steps: a blocking
all-gather of bytes, planning from the gathered tables, and moving the plan's
remote ops (see :class:`Mover`).
"""

from __future__ import annotations

import contextlib
import struct
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Protocol, Sequence, Tuple

import numpy as np

from tensorxfer.resharding.copy_services import _tensors
from tensorxfer.resharding.copy_services.planning import matching, plan_cache
from tensorxfer.resharding.copy_services._liveness import PeerWatch, own_identity
from tensorxfer.resharding.copy_services._pattern import OpPattern, pattern_for
from tensorxfer.resharding.copy_services._queue import Columns
from tensorxfer.resharding.copy_services.base import TaskMismatchError, check_timeout

UNSET: Any = object()  # run()'s timeout argument when not given
# Which collective step a metadata all-gather belongs to (with the run index, its identity).
_STEP_CONSTRUCTION, _STEP_AGREEMENT, _STEP_TABLES, _STEP_STATUS, _STEP_DIRECT_ADDRESSES = 1, 2, 3, 4, 5
# The steps of a plan across hosts (_hosts_plan): whether every rank's tensors allow a native plan, the
# host probe's two exchanges, the host groups' names.
STEP_NATIVE_PLAN, STEP_HOST_PROBE, STEP_HOST_SEEN, STEP_HOST_NAMES = 6, 7, 8, 9


class Mover(Protocol):
    """What a backend's transport does in a run (the rest is the protocol's)."""

    def send_flags(self, spans: _tensors.Spans, rows: np.ndarray) -> Optional[np.ndarray]:
        """The FLAGS column for the sends ``spans[rows]`` (this rank's remote sends), or
        None for none: a backend whose plan depends on where a source lies says so here."""

    def build_plan(self, tables: List[Tuple[np.ndarray, np.ndarray]], digests: List[bytes]) -> Any:
        """This rank's plan from every rank's op tables (the same input on every rank);
        ``.has_remote_work`` says whether ``execute`` has anything to do."""

    def execute(self, plan: Any, send_tensors: Sequence[Any], send_spans: _tensors.Spans,
                recv_tensors: Sequence[Any], recv_spans: _tensors.Spans, deadline: Optional[float],
                timeout: Optional[float]) -> None:
        """Moves the remote ops (tensors and spans in the order of the plan's local indices)."""


Gather = Callable[[bytes, bool, Optional[float], Optional[float]], List[bytes]]


class RunProtocol:
    """Agreement, plan reuse and failure handling of a multi-process backend's runs.

    ``gather(data, fixed, deadline, timeout)``: every rank's ``data`` in rank
    order (``fixed``: every rank passes as many bytes); TimeoutError at the
    deadline, PeerLostError when a peer died. ``plan_options``: the options that
    shape the plan, compared on every rank at construction (a collective step).
    ``timeout``: seconds a run waits for its peers (None = forever, still
    watching same-host peers and Ctrl-C). ``on_broken``: called once a run
    failed in a way the ranks did not agree on.
    """

    def __init__(self, backend_name: str, rank: int, world_size: int, gather: Gather,
                 plan_options: Dict[str, Optional[int]], timeout: Optional[float],
                 on_broken: Optional[Callable[[], None]] = None) -> None:
        self.backend_name = backend_name
        self.rank = rank
        self.world_size = world_size
        self.timeout = timeout
        self.mover: Optional[Mover] = None  # set by the backend once its transport exists
        self._gather = gather
        self._on_broken = on_broken
        self._plans = plan_cache.PlanCache()
        self.broken: Optional[str] = None
        self._agreed_error: Optional[BaseException] = None  # the last error every rank raised alike
        self._run_index = 0  # run() calls that reached the agreement, the same on every rank
        self._pattern: Optional[OpPattern] = None  # the last run's (see _pattern)
        self.watch = self._agree_at_construction(plan_options)

    def _agree_at_construction(self, options: Dict[str, Optional[int]]) -> PeerWatch:
        """All-gathers the plan options and the ranks' identities: ValueError on every
        rank naming both values when an option differs; the PeerWatch otherwise."""
        encoded = struct.pack(f"<{len(options)}q", *(-1 if value is None else value for value in options.values()))
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        gathered = self.all_gather(_STEP_CONSTRUCTION, encoded + own_identity(), deadline, self.timeout)
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

    def close(self) -> None:
        """Drops the cached plan (and its staging buffers) and pattern."""
        self._plans.clear()
        self._pattern = None

    # ---- run ------------------------------------------------------------------------

    def run(self, take: Callable[[], Tuple[Columns, Columns]], timeout: Optional[float] = UNSET) -> None:
        """Execute the ops ``take()`` returns (the queue's, which it empties) as one batch
        (collective: every rank calls it).

        Raises TaskMismatchError (ops that do not pair up) or the error of a rank
        that could not take part (a bad tensor) on every rank, before any byte
        moves: the service stays usable. Any other failure (TimeoutError: a peer
        did not take part within the timeout; tensorxfer.PeerLostError: a peer
        died; a failed transfer or copy; KeyboardInterrupt) leaves this rank's
        peers unable to finish the batch, so the service cannot run again.
        """
        deadline, timeout = self._begin(f"{self.backend_name}.run()", "run", timeout)
        sends, recvs = take()
        with self._breaks_unless_agreed():
            self._run(sends, recvs, deadline, timeout)

    def _begin(self, caller: str, operation: str, timeout: Optional[float]) -> Tuple[Optional[float], Optional[float]]:
        """Refuses a broken service (naming ``caller``); the call's timeout and its one deadline."""
        if self.broken is not None:
            raise RuntimeError(f"{caller}: an earlier run failed ({self.broken}); close this service")
        timeout = self.timeout if timeout is UNSET else check_timeout(timeout, f"{self.backend_name}.{operation}")
        return (None if timeout is None else time.monotonic() + timeout), timeout

    @contextlib.contextmanager
    def _breaks_unless_agreed(self) -> Iterator[None]:
        """A failure inside breaks the service, unless every rank agreed on it (``_agreed_error``):
        peers may be waiting on this rank, requests may still be posted into user memory."""
        try:
            yield
        except BaseException as error:
            if error is not self._agreed_error:
                self.mark_broken(error)
            raise
        finally:
            self._agreed_error = None

    def _run(self, sends: Columns, recvs: Columns, deadline: Optional[float], timeout: Optional[float]) -> None:
        mover = self.mover
        assert mover is not None, "the backend sets RunProtocol.mover before its first run"
        prepared = self._prepare(sends, recvs, mover.build_plan, deadline, timeout, cached=True)
        pattern, plan, send_spans, recv_spans = prepared
        if pattern.pairs[0].size:
            _tensors.copy_pairs(pattern.pairs, sends.tensors, recvs.tensors, send_spans, recv_spans)
        if plan.has_remote_work:
            send_tensors, send_spans = pattern.sends.remote_part(sends.tensors, send_spans)
            recv_tensors, recv_spans = pattern.recvs.remote_part(recvs.tensors, recv_spans)
            mover.execute(plan, send_tensors, send_spans, recv_tensors, recv_spans, deadline, timeout)

    def _prepare(self, sends: Columns, recvs: Columns, build_plan: Callable[..., Any], deadline: Optional[float],
                 timeout: Optional[float], cached: bool, send_flags: Optional[Callable[..., Any]] = None
                 ) -> Tuple[OpPattern, Any, _tensors.Spans, _tensors.Spans]:
        """Steps (1)-(3) of a run: the agreement and this rank's plan (``build_plan(tables,
        digests)``; the cached one when ``cached`` and every digest is unchanged), with the
        pattern and the tensors' spans."""
        mover = self.mover
        assert mover is not None, "the backend sets RunProtocol.mover before its first run"
        local_error: Optional[BaseException] = None
        digest = bytes(16)
        try:
            send_spans = sends.spans()
            recv_spans = recvs.spans()
            pattern = pattern_for(self._pattern, self.backend_name, self.rank, sends, recvs)
            # A pattern whose same-rank ops do not pair up is not kept (its error is raised anew).
            self._pattern = pattern if pattern.match_error is None else None
            local_error = pattern.local_error(send_spans.nbytes, recv_spans.nbytes)
            flags = send_flags if send_flags is not None else mover.send_flags
            send_table, recv_table, digest = pattern.tables(send_spans.nbytes, recv_spans.nbytes,
                                                            flags(send_spans, pattern.sends.remote))
        except Exception as error:  # a tensor this rank cannot describe: agreed like a mismatch
            local_error = error
        digests = self._agree(digest, local_error, deadline, timeout)

        plan = self._plans.get(digests) if cached else None
        if plan is None:
            if cached:
                self._plans.clear()
            tables_data = self.all_gather(_STEP_TABLES, matching.encode_tables(send_table, recv_table),
                                           deadline, timeout)
            tables = [matching.decode_tables(data) for data in tables_data]
            try:
                plan = build_plan(tables, digests)
            except TaskMismatchError as error:  # every rank plans from the same tables: agreed
                self._agreed_error = error
                raise
            if cached:
                self._plans.put(digests, plan)
        return pattern, plan, send_spans, recv_spans

    def prepare(self, sends: Columns, recvs: Columns, build_plan: Callable[..., Any],
                timeout: Optional[float] = UNSET, send_flags: Optional[Callable[..., Any]] = None
                ) -> Tuple[OpPattern, Any, _tensors.Spans, _tensors.Spans]:
        """The agreement and a new plan of ``sends`` / ``recvs`` (``build_plan(tables,
        digests)``), without moving anything (collective; a persistent plan's build).
        ``send_flags(spans, rows)``: the FLAGS of the remote sends (default: the mover's).
        Raises as run() does, and breaks the service as run() does."""
        deadline, timeout = self._begin(self.backend_name, "plan", timeout)
        with self._breaks_unless_agreed():
            return self._prepare(sends, recvs, build_plan, deadline, timeout, cached=False, send_flags=send_flags)

    def mark_broken(self, error: BaseException) -> None:
        """After a failure the ranks did not agree on: this service cannot run again."""
        if self.broken is None:
            self.broken = f"{type(error).__name__}: {error}"
            if self._on_broken is not None:
                self._on_broken()

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

    def agree_on_step(self, what: str, local_error: Optional[BaseException], deadline: Optional[float],
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
        records = self.all_gather(step, record + struct.pack("<Q", len(message)), deadline, timeout, fixed=True)
        texts = [""] * len(records)
        if any(struct.unpack_from("<Q", data, len(record))[0] for data in records):
            texts = [bytes(data).decode(errors="replace")
                     for data in self.all_gather(step, message, deadline, timeout)]
        return [(bytes(data[:len(record)]), text) for data, text in zip(records, texts)]

    def all_gather(self, step: int, data: bytes, deadline: Optional[float], timeout: Optional[float],
                    fixed: bool = False) -> List[bytes]:
        """Every rank's ``data``, each gathered with the identity of the operation it
        belongs to (the run and its step): a rank out of step raises RuntimeError."""
        header = struct.pack("<QQ", self._run_index, step)
        result = self._gather(header + data, fixed, deadline, timeout)
        for rank, item in enumerate(result):
            if bytes(item[:16]) != header:
                theirs = struct.unpack_from("<QQ", item) if len(item) >= 16 else ("?", "?")
                raise RuntimeError(f"{self.backend_name}: ranks out of step: rank {self.rank} is at run "
                                   f"{self._run_index} step {step}, rank {rank} at run {theirs[0]} step {theirs[1]}")
        return [bytes(item[16:]) for item in result]

    @property
    def run_index(self) -> int:
        """The runs that reached the agreement: the same on every rank, the identity of the current one."""
        return self._run_index

    @property
    def plans_built(self) -> int:
        """How many runs had to build their plan (the rest reused one)."""
        return self._plans.plans_built
