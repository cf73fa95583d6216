"""A persistent plan of the ``torch`` and ``mpi`` services, however the ranks are placed (private).

The ranks of the service's group are probed once for the hosts they share memory with
(``tensorxfer.runtime.host_probe``). A plan then has two parts, run at once by ``run()``:

* **inside each host**, the same-rank pairs and the pairs of ranks on one host: the
  native shm plan (``ShmCopyService`` on a ``LocalGroup`` of the host's ranks, made
  once per service), or the same-rank copies alone on a host of one rank;
* **between hosts**, the streams of ``_network_plan`` on the service's own engine (gloo
  through its process group, or MPI), run by ``_network_run.NetworkRun``.

Every rank checks the whole batch first, as ``run()`` does (every op matched by task id
and byte size on every rank, before anything is planned). On one host, a plan is the shm
plan alone, with no network step at all.
"""

from __future__ import annotations

import atexit
import collections
import secrets
import time
import weakref
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from tensorxfer import _core
from tensorxfer.resharding._copy_engine import resharding_copy_engine
from tensorxfer.resharding.copy_services import _network_plan, _tensors
from tensorxfer.resharding.copy_services._network_run import NetworkRun, StreamPart
from tensorxfer.resharding.copy_services._queue import Columns, SubmitQueue
from tensorxfer.resharding.copy_services._run_protocol import (STEP_HOST_NAMES, STEP_HOST_PROBE, STEP_HOST_SEEN,
                                                                STEP_NATIVE_PLAN, UNSET, RunProtocol)
from tensorxfer.resharding.copy_services.planning import matching
from tensorxfer.runtime.group import LocalGroup
from tensorxfer.runtime.host_probe import host_of_ranks, probe_hosts

#: Messages a stream keeps in flight (staging buffers per role). Measured on the simulated
#: cluster (bench_refit_hosts.py): 2 keeps a sender's NIC busy; a relay forwards message k
#: while k+1 arrives, so it keeps one more.
SEND_DEPTH, RECEIVE_DEPTH, RELAY_DEPTH = 2, 2, 3
#: A receive side unpacks with streaming stores from this many bytes per run.
STREAMING_UNPACK_BYTES = 8 << 20


class HostLayout:
    """The group's hosts (probed once) and this host's shared-memory service."""

    def __init__(self, protocol: RunProtocol, timeout: Optional[float]) -> None:
        deadline = None if timeout is None else _now() + timeout
        steps = iter((STEP_HOST_PROBE, STEP_HOST_SEEN))

        def exchange(data: bytes) -> List[bytes]:
            return protocol.all_gather(next(steps), data, deadline, timeout)

        self.rank = protocol.rank
        self.hosts: List[List[int]] = probe_hosts(exchange)
        self.host_of: List[int] = host_of_ranks(self.hosts)
        self.local_ranks: List[int] = self.hosts[self.host_of[self.rank]]
        proposals = protocol.all_gather(STEP_HOST_NAMES, f"tplan-{secrets.token_hex(12)}".encode(), deadline, timeout)
        self.group: Optional[LocalGroup] = None
        self.shm: Any = None
        if len(self.local_ranks) > 1:
            from tensorxfer.resharding.copy_services.shm import ShmCopyService

            name = proposals[self.local_ranks[0]].decode()
            self.group = LocalGroup.join(name, rank=self.local_ranks.index(self.rank),
                                         world_size=len(self.local_ranks), timeout=timeout)
            try:
                self.shm = ShmCopyService(self.group, timeout=timeout)
            except BaseException:
                self.group.close()
                raise

    @property
    def single_host(self) -> bool:
        return len(self.hosts) == 1

    def close(self) -> None:
        """Leaves the host's group (idempotent)."""
        shm, group, self.shm, self.group = self.shm, self.group, None, None
        if shm is not None:
            shm.close()
        if group is not None:
            group.close()


class HostsRunner:
    """Runs a plan's two parts (see the module docstring): ``run(version, runs, timeout)``."""

    def __init__(self, layout: HostLayout, local: Optional[Callable[[int, int, Optional[float]], None]],
                 local_bytes: int, network: Optional[NetworkRun], network_bytes: int, plan_id: int,
                 streams: Sequence[_network_plan.Stream] = ()) -> None:
        self.layout = layout
        self._local = local
        self._network = network
        self.bytes = local_bytes + network_bytes
        self.plan_id = plan_id
        self.hosts = [list(ranks) for ranks in layout.hosts]
        self.routes = [(stream.src, stream.receivers, stream.nbytes) for stream in streams]
        #: Seconds the part inside this host took, in the last runs (at most 64).
        self.local_seconds: "collections.deque[float]" = collections.deque(maxlen=64)

    def run(self, version: int, runs: int, timeout: Optional[float]) -> None:
        """One run (collective); after a failure the host's shared memory is released at once,
        so that its peers' waits end and nothing is left in /dev/shm when the process exits."""
        try:
            self._run(version, runs, timeout)
        except BaseException:
            self.layout.close()
            raise

    def _run(self, version: int, runs: int, timeout: Optional[float]) -> None:
        local = self._local
        if self._network is None:
            if local is not None:
                self._timed(local, version, runs, timeout)
            return
        work = None
        if local is not None:
            def work(deadline: Optional[float]) -> None:
                self._timed(local, version, runs, None if deadline is None else max(deadline - _now(), 0.0))
        self._network.run(version, timeout, work)

    def _timed(self, local: Callable[[int, int, Optional[float]], None], version: int, runs: int,
               timeout: Optional[float]) -> None:
        started = _now()
        local(version, runs, timeout)
        self.local_seconds.append(_now() - started)

    def close(self) -> None:
        if self._network is not None:
            self._network.close()


def _now() -> float:
    return time.monotonic()


def build_hosts_plan(service: Any, protocol: RunProtocol, engine: Any, layout: HostLayout, sends: Columns,
                     recvs: Columns, timeout: Any, bucket_nbytes: int) -> HostsRunner:
    """A plan of these ops (collective over the service's group): see the module docstring."""
    from tensorxfer.resharding.persistent_plan import describe_views, plan_digest

    send_meta, send_dims = describe_views(sends.tensors)
    recv_meta, recv_dims = describe_views(recvs.tensors)

    def source_flags(spans: _tensors.Spans, rows: np.ndarray) -> np.ndarray:
        return _network_plan.source_keys(send_meta, send_dims, rows)

    def match(tables: List[Tuple[np.ndarray, np.ndarray]], digests: List[bytes]) -> Tuple[Any, ...]:
        matched_sends, matched_recvs = matching.match_tables(service.backend_name, tables)
        return matched_sends, matched_recvs, digests

    pattern, (all_sends, all_recvs, digests), _, _ = protocol.prepare(sends, recvs, match, timeout,
                                                                      send_flags=source_flags)
    plan_id = plan_digest(digests, protocol.run_index)
    rank, host_of = protocol.rank, layout.host_of
    local, local_bytes = _host_part(service, layout, pattern, sends, recvs, send_meta, send_dims, recv_meta,
                                    recv_dims, timeout)
    network, network_bytes, streams = None, 0, []
    if not layout.single_host:
        crossing = (np.asarray(host_of)[all_sends[:, matching.SRC]] != np.asarray(host_of)[all_sends[:, matching.DST]]
                    if all_sends.shape[0] else np.zeros(0, bool))
        net_sends, net_recvs = all_sends[crossing], all_recvs[crossing]
        streams = _network_plan.plan_streams(net_sends, host_of, bucket_nbytes)
        if len(streams) + 1 >= engine.max_tags:
            raise ValueError(f"{service.backend_name}: a plan of {len(streams)} streams between hosts needs more tags "
                             f"than the engine has ({engine.max_tags})")
        roles = _network_plan.roles_of(rank, streams, net_sends, net_recvs)
        parts = _stream_parts(engine, roles, pattern, send_meta, send_dims, recv_meta, recv_dims, (sends, recvs))
        network_bytes = sum(int(part.role.stream.nbytes) for part in parts if part.role.upstream is not None)
        # Packs and unpacks on the calling thread (copy engine None): as fast as the copy
        # engine's threads or faster in bench_refit_hosts.py (weights without a rate limit:
        # 165 ms against 187 ms; with the NIC's limit 0.95x the NIC floor against 0.93x).
        network = NetworkRun(engine, None, rank, protocol.world_size, host_of, parts, plan_id)
    return HostsRunner(layout, local, local_bytes, network, network_bytes, plan_id, streams)


def _host_part(service: Any, layout: HostLayout, pattern: Any, sends: Columns, recvs: Columns,
               send_meta: np.ndarray, send_dims: np.ndarray, recv_meta: np.ndarray, recv_dims: np.ndarray,
               timeout: Any) -> Tuple[Optional[Callable[[int, int, Optional[float]], None]], int]:
    """The part inside this host: (run(version, runs, timeout) or None, bytes it writes per run).
    Collective over the host's ranks when the host has several."""
    here = set(layout.local_ranks)
    if layout.shm is not None:
        from tensorxfer.resharding import persistent_plan as persistent

        local_of = {global_rank: index for index, global_rank in enumerate(layout.local_ranks)}
        mine = [i for i, peer in enumerate(sends.ranks) if peer in here]
        theirs = [i for i, peer in enumerate(recvs.ranks) if peer in here]
        shm_timeout = persistent.SERVICE_TIMEOUT if timeout is UNSET else timeout
        steps, plan_id, executor, _ = layout.shm._build_persistent(
            [sends.task_ids[i] for i in mine], [sends.tensors[i] for i in mine],
            [local_of[sends.ranks[i]] for i in mine], [recvs.task_ids[i] for i in theirs],
            [recvs.tensors[i] for i in theirs], [local_of[recvs.ranks[i]] for i in theirs], shm_timeout)
        if not steps.num_spans and not steps.num_iterations and executor is None:
            return None, 0

        def run_shm(version: int, runs: int, run_timeout: Optional[float]) -> None:
            executor.execute_steps(steps, plan_id, version, runs, run_timeout)

        return run_shm, int(steps.bytes)
    pairs = pattern.pairs
    if not pairs[0].size:
        return None, 0
    steps = _core.build_local_steps(send_meta, send_dims, recv_meta, recv_dims,
                                    np.stack(pairs, axis=1).astype(np.uint64), None)
    engine = resharding_copy_engine()

    def run_local(version: int, runs: int, run_timeout: Optional[float]) -> None:
        steps.copy_local(engine)

    return run_local, int(steps.bytes)


def _stream_parts(engine: Any, roles: Sequence[_network_plan.Role], pattern: Any, send_meta: np.ndarray,
                  send_dims: np.ndarray, recv_meta: np.ndarray, recv_dims: np.ndarray,
                  columns: Tuple[Columns, Columns]) -> List[StreamPart]:
    """Each role's messages, staging and engine buffers (allocated once, here)."""
    views: Dict[str, _core.StreamViews] = {}
    parts = []
    for role in roles:
        sending = role.upstream is None
        side = "sends" if sending else "receives"
        if side not in views:
            meta, dims = (send_meta, send_dims) if sending else (recv_meta, recv_dims)
            views[side] = _core.StreamViews(meta, dims, side)
        stream_views = views[side]
        remote_rows = (pattern.sends if sending else pattern.recvs).remote
        items = remote_rows[role.items.astype(np.int64)].astype(np.uint64)  # remote op -> op index
        sizes = role.stream.sizes
        depth = SEND_DEPTH if sending else (RELAY_DEPTH if role.downstream is not None else RECEIVE_DEPTH)
        staged = stream_views.staged_count(items, sizes)
        staging = [engine.staging(int(sizes.max())) for _ in range(depth)] if staged else []
        streaming = not sending and role.stream.nbytes >= STREAMING_UNPACK_BYTES
        messages = stream_views.messages(items, sizes, np.array([address for _, address in staging], np.uint64),
                                         int(sizes.max()) if sizes.size else 0, streaming,
                                         (columns, [buffer for buffer, _ in staging]))
        direct = messages.direct
        buffers = [engine.buffer(int(direct[k]), int(sizes[k])) if direct[k]
                   else staging[k % depth][0][:int(sizes[k])] for k in range(sizes.size)]
        header_out, _ = engine.staging(24)
        header_in, _ = engine.staging(24)
        parts.append(StreamPart(role, messages, buffers, direct == 0, depth, header_out[:24],
                                engine.as_numpy(header_out)[:24].view(np.uint64), header_in[:24],
                                engine.as_numpy(header_in)[:24].view(np.uint64)))
    return parts


_live_planners: "weakref.WeakSet[HostsPlanner]" = weakref.WeakSet()


def _close_live_planners() -> None:
    """At exit: every planner still open leaves its host's group, so /dev/shm keeps nothing of it."""
    for planner in list(_live_planners):
        try:
            planner.close()
        except Exception:  # noqa: BLE001 - exiting anyway
            pass


atexit.register(_close_live_planners)


class HostsPlanner:
    """What a ``torch`` or ``mpi`` service holds to build persistent plans: the host
    layout (probed at the first build, collectively), and a network engine per plan
    (``make_engine(plan_index)``, collective, with the same index on every rank)."""

    def __init__(self, service: Any, protocol: RunProtocol, make_engine: Callable[[int], Any],
                 bucket_nbytes: int) -> None:
        self._service = service
        self._protocol = protocol
        self._make_engine = make_engine
        self.bucket_nbytes = bucket_nbytes
        self._layout: Optional[HostLayout] = None
        self._runners: List[HostsRunner] = []
        _live_planners.add(self)

    @property
    def hosts(self) -> Optional[List[List[int]]]:
        """The hosts of the group (lists of ranks), once the first plan probed them."""
        return None if self._layout is None else self._layout.hosts

    def build(self, send_ids: List[Any], send_tensors: List[Any], send_peers: List[int], recv_ids: List[Any],
              recv_tensors: List[Any], recv_peers: List[int], timeout: Any) -> Optional[HostsRunner]:
        """A runner of these ops (collective), or None where the plan would have to move
        device tensors (those plans submit their ops again on every run)."""
        from tensorxfer.resharding import persistent_plan as persistent

        service = self._service
        queue = SubmitQueue(service.backend_name, service.world_size, host_only=False)  # the submits' own checks
        for task_id, tensor, peer in zip(send_ids, send_tensors, send_peers):
            queue.submit_send(tensor, peer, task_id)
        for task_id, tensor, peer in zip(recv_ids, recv_tensors, recv_peers):
            queue.submit_recv(tensor, peer, task_id)
        sends, recvs = queue.take()
        on_host = all(not _tensors.is_torch(tensor) or tensor.device.type == "cpu"
                      for tensor in sends.tensors + recvs.tensors)
        prepare_timeout = UNSET if timeout is persistent.SERVICE_TIMEOUT else timeout
        wait = self._protocol.timeout if prepare_timeout is UNSET else prepare_timeout
        # Every rank decides alike whether the plan is native (host tensors everywhere).
        flags = self._protocol.all_gather(STEP_NATIVE_PLAN, bytes([on_host]), None if wait is None else _now() + wait,
                                          wait)
        if not all(flag == b"\x01" for flag in flags):
            return None
        if self._layout is None:
            self._layout = HostLayout(self._protocol, wait)
        engine = None if self._layout.single_host else self._make_engine(self._protocol.run_index)
        try:
            runner = build_hosts_plan(service, self._protocol, engine, self._layout, sends, recvs, prepare_timeout,
                                      self.bucket_nbytes)
        except BaseException:
            if engine is not None:
                engine.close()
            raise
        self._runners.append(runner)
        return runner

    def close(self) -> None:
        for runner in self._runners:
            runner.close()
        self._runners = []
        if self._layout is not None:
            self._layout.close()
            self._layout = None
