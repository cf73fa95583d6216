"""Persistent plans: a batch of sends and receives resolved once, run many times.

A refit copies the same weights between the same layouts after every training step. A
copy service's ``run()`` pays for every task each time (a submit call, torch's attribute
reads, matching or at least comparing the pattern). A :class:`PersistentPlan` pays that once::

    plan = build_persistent_plan(service, sends, recvs)   # collective, once
    for step in range(steps):
        train_step()
        plan.run(version=step)                             # collective, every step

Building resolves everything per task in C++: each tensor's strided layout becomes its
contiguous pieces, the schedule's segments become (source, destination, bytes) spans, and
a run is one native call that releases the GIL, reads no torch attribute and does no Python
work per task. Strided sources and destinations are moved in place: no ``.contiguous()``
staging, no temporary receive buffers; destination tensors keep their addresses.

The contract is the one CUDA graphs have: **every tensor given to the plan stays alive at
the same address, with the same shape and strides, for as long as the plan is run** (write
into it in place; do not resize it or re-point it with ``set_`` / ``.data =``). The plan
holds a reference to every tensor, so they are not freed, but it does not look at them
again: :meth:`PersistentPlan.verify` does, on request.

Each run carries a weight version (an int, the same on every rank; by default the last one
plus 1). A run that returns has landed on every rank; ``landed_version`` is the last such
version. A run that fails (a peer lost, a timeout, ranks running different plans or
versions) raises :class:`PersistentPlanError` on every rank that sees it, naming the last
version that fully landed, and the plan cannot run again. A rank whose group or plan
changed (a plan built apart from its peers', or on another service) is refused by the
barrier tags every run carries: a cheap check, two words per rank per barrier.

Backends: ``shm`` (the native plan: same-rank pairs copied once, sources in a sender's
shared send buffer read once by their receiver, everything else through the pipeline's
slots, two copies) and ``local`` (same-rank copies only, one native call). The ``mpi`` and
``torch`` backends plan across hosts, however the ranks are placed: inside each host the
``shm`` plan of that host's ranks (the same-rank copies alone on a host of one rank),
between hosts streams on the service's own transport (gloo through its process group, or
MPI); :attr:`PersistentPlan.hosts` and :attr:`PersistentPlan.routes` describe them. Where
any rank's ops hold a device tensor, they get a plan that submits its ops again on every
run (same results, none of the speed).
"""

from __future__ import annotations

import hashlib
import struct
import sys
from typing import Any, Callable, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from tensorxfer import _core
from tensorxfer.errors import ClosedError, TensorxferError

_UINT64_MAX = (1 << 64) - 1
#: run()'s timeout when not given (the service's).
SERVICE_TIMEOUT: Any = object()


class PersistentPlanError(TensorxferError):
    """A persistent plan's run failed.

    ``landed_version`` is the last version that fully landed on every rank (None: none
    did), ``version`` the one that failed.
    """

    def __init__(self, message: str, landed_version: Optional[int], version: int) -> None:
        super().__init__(message)
        self.landed_version = landed_version
        self.version = version


def _ops(ops: Iterable[Any], peer_field: str, argument: str) -> Tuple[List[Optional[int]], List[Any], List[int]]:
    """(task ids, tensors, peers) of SendOp / RecvOp objects or (task_id, tensor, peer) tuples."""
    ids: List[Optional[int]] = []
    tensors: List[Any] = []
    peers: List[int] = []
    for op in ops:
        if isinstance(op, tuple):
            if len(op) != 3:
                raise TypeError(f"{argument}: expected (task_id, tensor, {peer_field}) tuples, got {len(op)} items")
            task_id, tensor, peer = op
        else:
            task_id, tensor, peer = op.task_id, op.tensor, getattr(op, peer_field)
        ids.append(task_id)
        tensors.append(tensor)
        peers.append(peer)
    return ids, tensors, peers


def describe_views(tensors: Sequence[Any]) -> Tuple[np.ndarray, np.ndarray]:
    """(meta, dims) of host tensors for the native builder.

    Args:
        tensors: numpy arrays or CPU torch tensors.

    Returns:
        ``(meta, dims)``: meta rows (address, itemsize, ndim), dims rows (size, stride in
        bytes), ``ndim`` of them per tensor, in order.

    Raises:
        ValueError: a torch tensor not on the CPU.
        TypeError: neither a numpy array nor a torch tensor.
    """
    meta = np.zeros((len(tensors), 3), np.uint64)
    dims: List[Tuple[int, int]] = []
    torch = sys.modules.get("torch")
    for i, tensor in enumerate(tensors):
        if isinstance(tensor, np.ndarray):
            itemsize = tensor.itemsize
            address = tensor.ctypes.data
            shape, strides = tensor.shape, tensor.strides
        elif torch is not None and isinstance(tensor, torch.Tensor):
            if tensor.device.type != "cpu":
                raise ValueError(f"tensor {i}: a persistent plan moves host (cpu) tensors only, got {tensor.device}")
            itemsize = tensor.element_size()
            address = tensor.data_ptr()
            shape = tuple(tensor.shape)
            strides = tuple(stride * itemsize for stride in tensor.stride())
        else:
            raise TypeError(f"tensor {i}: expected a numpy array or torch tensor, got {type(tensor).__name__}")
        meta[i] = (address, itemsize, len(shape))
        dims.extend(zip(shape, strides))
    return meta, np.array(dims, np.int64).reshape(-1, 2)


def _tensors_of(ops: Sequence[Tuple[Any, Any, Any]]) -> List[Any]:
    return [tensor for _, tensor, _ in ops]


def _layouts(tensors: Sequence[Any]) -> List[Tuple[int, Tuple[int, ...], Tuple[int, ...]]]:
    meta, dims = describe_views(tensors)
    layouts = []
    start = 0
    for address, _, ndim in meta.tolist():
        rows = dims[start:start + ndim]
        start += ndim
        layouts.append((address, tuple(rows[:, 0].tolist()), tuple(rows[:, 1].tolist())))
    return layouts


class StepsRunner:
    """Runs a plan's native copy lists (``_core.PersistentSteps``).

    Through the shm executor's barriers, or, without an executor, the same-rank copies alone.
    """

    def __init__(self, steps: Any, plan_id: int, executor: Any = None, engine: Any = None) -> None:
        self.steps = steps
        self.plan_id = plan_id
        self._executor = executor
        self._engine = engine

    @property
    def bytes(self) -> int:
        return int(self.steps.bytes)

    def run(self, version: int, runs: int, timeout: Optional[float]) -> None:
        if self._executor is None:
            self.steps.copy_local(self._engine)
        else:
            self._executor.execute_steps(self.steps, self.plan_id, version, runs, timeout)

    def close(self) -> None:
        self.steps = None


class PersistentPlan:
    """A batch of sends and receives resolved once (see the module docstring).

    Built by :func:`build_persistent_plan`; ``run()`` is collective when any rank moves
    bytes between processes.
    """

    def __init__(self, service: Any, sends: List[Any], recvs: List[Any], runner: Any = None) -> None:
        self.service = service
        self._sends = sends  # the tensors: kept alive for as long as the plan
        self._recvs = recvs
        self._runner = runner  # None: the ops are submitted again on every run
        self._layouts = (_layouts(_tensors_of(sends)), _layouts(_tensors_of(recvs))) if runner is not None else None
        self.plan_id = runner.plan_id if runner is not None else 0
        self.native = runner is not None
        self.landed_version: Optional[int] = None
        self._last_version: Optional[int] = None
        self._runs = 0
        self.broken: Optional[str] = None
        self._closed = False

    @property
    def bytes_per_run(self) -> int:
        """Bytes this rank writes into its destinations per run."""
        return int(self._runner.bytes) if self._runner is not None else 0

    @property
    def hosts(self) -> Optional[List[List[int]]]:
        """The ranks of each host the plan spans (found by probing shared memory).

        On the backends that plan across hosts (``torch``, ``mpi``); None elsewhere.
        """
        return getattr(self._runner, "hosts", None)

    @property
    def routes(self) -> List[Tuple[int, Tuple[int, ...], int]]:
        """The plan's streams between hosts, as (sender, receivers, bytes per run) tuples.

        The same list on every rank. Several receivers form a chain: the sender sends to the
        first, each receiver forwards to the next (replicas of the same source bytes).
        """
        return list(getattr(self._runner, "routes", []))

    @property
    def runs(self) -> int:
        """Runs that landed."""
        return self._runs

    def run(self, version: Optional[int] = None, timeout: Any = SERVICE_TIMEOUT) -> int:
        """Moves every task once (collective), in place; returns the version that landed.

        Args:
            version: this run's weight version, the same on every rank (default: the last
                plus 1, from 0).
            timeout: seconds the whole run may wait for its peers, one deadline for all of
                its barriers (default: the service's; None: no deadline, still watching the
                peers and Ctrl-C).

        Returns:
            The version that landed.

        Raises:
            PersistentPlanError: the run failed (the error names ``landed_version``); the
                plan cannot run again then.
            tensorxfer.ClosedError: after close().
            TypeError: ``version`` is not an int in [0, 2**64).
        """
        if self._closed:
            raise ClosedError("PersistentPlan is closed")
        if self.broken is not None:
            raise PersistentPlanError(f"PersistentPlan: an earlier run failed ({self.broken}); the last version that "
                                      f"landed is {self.landed_version}", self.landed_version,
                                      -1 if version is None else version)
        if version is None:
            version = 0 if self._last_version is None else self._last_version + 1
        if isinstance(version, bool) or not isinstance(version, int) or not 0 <= version <= _UINT64_MAX:
            raise TypeError(f"version: expected an int in [0, 2**64), got {version!r}")
        self._last_version = version
        try:
            if self._runner is None:
                self._resubmit(timeout)
            else:
                if timeout is SERVICE_TIMEOUT:
                    timeout = getattr(self.service, "timeout", None)
                self._runner.run(version, self._runs, timeout)
        except BaseException as error:
            self.broken = f"{type(error).__name__}: {error}"
            protocol = getattr(self.service, "_protocol", None)
            if protocol is not None and self._runner is not None:
                protocol.mark_broken(error)  # peers may still wait in the service's barriers
            raise PersistentPlanError(f"PersistentPlan: version {version} did not land on every rank ({error}); the "
                                      f"last version that landed is {self.landed_version}", self.landed_version,
                                      version) from error
        self._runs += 1
        self.landed_version = version
        return version

    def _resubmit(self, timeout: Any) -> None:
        service = self.service
        for task_id, tensor, peer in self._sends:
            service.submit_send(tensor, peer, task_id)
        for task_id, tensor, peer in self._recvs:
            service.submit_recv(tensor, peer, task_id)
        service.run() if timeout is SERVICE_TIMEOUT else service.run(timeout)

    def verify(self) -> None:
        """Checks that every tensor kept the address, shape and strides it had when the plan was built.

        Reads every tensor's attributes: a check, not a run step.

        Raises:
            ValueError: naming the first tensor whose address, shape or strides changed
                since the plan was built.
        """
        if self._layouts is None:
            return
        for side, tensors, layouts in (("send", self._sends, self._layouts[0]), ("receive", self._recvs,
                                                                               self._layouts[1])):
            for i, (now, then) in enumerate(zip(_layouts(_tensors_of(tensors)), layouts)):
                if now != then:
                    raise ValueError(f"PersistentPlan: {side} tensor {i} moved or changed layout since the plan was "
                                     f"built (address, shape, strides {then} -> {now}); build a new plan")

    def close(self) -> None:
        """Drops the copy lists and the tensors (the service stays open)."""
        self._closed = True
        if self._runner is not None:
            self._runner.close()
            self._runner = None
        self._sends = []
        self._recvs = []

    def __enter__(self) -> "PersistentPlan":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"PersistentPlan(native={self.native}, bytes_per_run={self.bytes_per_run}, runs={self._runs}, "
                f"landed_version={self.landed_version})")


def build_persistent_plan(service: Any, sends: Iterable[Any], recvs: Iterable[Any],
                          timeout: Any = SERVICE_TIMEOUT) -> PersistentPlan:
    """A :class:`PersistentPlan` of ``sends`` and ``recvs`` on ``service``.

    Collective for a multi-process service: every rank builds its plan together, as for
    run(). The ops are checked as run() checks a batch (same-rank pairs by task id, byte
    sizes agreed on every rank before anything is planned).

    Args:
        service: a tensorxfer copy service (a
            :class:`~tensorxfer.resharding.copy_services.CopyService`).
        sends: (task_id, tensor, dest_rank) tuples or SendOp.
        recvs: (task_id, tensor, src_rank) tuples or RecvOp.
        timeout: seconds building may wait for the peers (default: the service's).

    Returns:
        The plan; run it with :meth:`PersistentPlan.run`.

    Raises:
        ~tensorxfer.resharding.copy_services.TaskMismatchError: the ops do not pair up
            (on every rank).
        RuntimeError: the checks failed otherwise (on every rank).
        TypeError: ``service`` is not a tensorxfer CopyService.
    """
    from tensorxfer.resharding.copy_services.base import CopyService
    from tensorxfer.resharding.copy_services.local import LocalCopyService

    if not isinstance(service, CopyService):
        raise TypeError(f"service: expected a tensorxfer CopyService, got {type(service).__name__}")
    service._check_open("persistent_plan")
    send_ids, send_tensors, send_peers = _ops(sends, "dest_rank", "sends")
    recv_ids, recv_tensors, recv_peers = _ops(recvs, "src_rank", "recvs")
    send_list = list(zip(send_ids, send_tensors, send_peers))
    recv_list = list(zip(recv_ids, recv_tensors, recv_peers))
    builder: Optional[Callable[..., Any]] = getattr(service, "_build_persistent_runner", None)
    if isinstance(service, LocalCopyService):
        runner = _build_local(service, send_ids, send_tensors, send_peers, recv_ids, recv_tensors, recv_peers)
    elif builder is not None:
        runner = builder(send_ids, send_tensors, send_peers, recv_ids, recv_tensors, recv_peers, timeout)
    else:
        runner = None
    return PersistentPlan(service, send_list, recv_list, runner)


def _build_local(service: Any, send_ids: List[Optional[int]], send_tensors: List[Any], send_peers: List[int],
                 recv_ids: List[Optional[int]], recv_tensors: List[Any], recv_peers: List[int]) -> StepsRunner:
    from tensorxfer.resharding._copy_engine import resharding_copy_engine
    from tensorxfer.resharding.copy_services._pattern import OpPattern

    for peer in list(send_peers) + list(recv_peers):
        if peer != service.rank:
            raise ValueError(f"LocalCopyService copies within rank {service.rank} only, got rank {peer}")
    pattern = OpPattern(service.backend_name, service.rank, send_ids, send_peers, recv_ids, recv_peers)
    if pattern.match_error is not None:
        raise pattern.match_error
    send_meta, send_dims = describe_views(send_tensors)
    recv_meta, recv_dims = describe_views(recv_tensors)
    check_pair_sizes(service.backend_name, service.rank, pattern, send_meta, send_dims, recv_meta, recv_dims)
    pairs = np.stack(pattern.pairs, axis=1).astype(np.uint64) if pattern.pairs[0].size else np.zeros((0, 2), np.uint64)
    steps = _core.build_local_steps(send_meta, send_dims, recv_meta, recv_dims, pairs, None)
    return StepsRunner(steps, plan_digest([bytes(16)], 0), None, resharding_copy_engine())


def view_nbytes(meta: np.ndarray, dims: np.ndarray) -> np.ndarray:
    """Byte size of every view described by describe_views."""
    sizes = np.empty(meta.shape[0], np.int64)
    start = 0
    for i, (_, itemsize, ndim) in enumerate(meta.tolist()):
        sizes[i] = int(np.prod(dims[start:start + ndim, 0], dtype=np.int64)) * itemsize
        start += ndim
    return sizes


def check_pair_sizes(backend: str, rank: int, pattern: Any, send_meta: np.ndarray, send_dims: np.ndarray,
                     recv_meta: np.ndarray, recv_dims: np.ndarray) -> None:
    error = pattern.local_error(view_nbytes(send_meta, send_dims), view_nbytes(recv_meta, recv_dims))
    if error is not None:
        raise error


def plan_digest(digests: Sequence[bytes], build_index: int) -> int:
    """The plan's identity in its barrier tags: every rank's op digests and the build's index."""
    hasher = hashlib.blake2b(digest_size=8)
    hasher.update(struct.pack("<Q", build_index))
    for digest in digests:
        hasher.update(digest)
    return int.from_bytes(hasher.digest(), "little")


__all__ = ["PersistentPlan", "PersistentPlanError", "build_persistent_plan", "describe_views"]
