# mypy: disable-error-code="override,assignment,attr-defined,call-arg"
# (torch's stubs type ProcessGroup's methods as overloads of the C++ bindings and
# omit the option classes' constructors; torch calls these Python overrides with
# the argument lists written here.)
"""``TensorxferProcessGroup``: the ``torch.distributed`` process group behind ``"tensorxfer"``.

Accelerated over shared memory (one :class:`~tensorxfer.runtime.Communicator`
per host; across hosts composed with one gloo or MPI step, see
:mod:`tensorxfer.distributed.hierarchical`): ``all_reduce`` (sum, avg, min,
max of float32/64, bfloat16, float16, int32, int64) and its coalesced form,
``reduce``, ``reduce_scatter`` and ``reduce_scatter_tensor`` (the same ops and
dtypes), ``all_gather``, ``all_gather_into_tensor`` and ``broadcast`` (any
dtype) and ``barrier``. Delegated to a gloo process group made on the same
store: everything else (``product`` and other dtypes, sparse tensors, ``gather``,
``scatter``, ``all_to_all``, ``all_to_all_single``,
``send``/``recv``/``isend``/``irecv``/``batch_isend_irecv``,
``all_gather_coalesced``).

Every op runs on the group's own thread, in submission order; delegated
collectives finish there before the next op starts, point-to-point ops are
started there and completed by a second thread. Non-CPU tensors go to the
backend named for their device (``"cpu:tensorxfer,cuda:nccl"``), else raise.
"""

from __future__ import annotations

import atexit
import multiprocessing.util
import secrets
import weakref
from datetime import timedelta
from typing import Any, Callable, List, Optional

import torch
import torch.distributed as dist
from torch.distributed import PrefixStore, ProcessGroupGloo

from tensorxfer.distributed import BACKEND_NAME
from tensorxfer.distributed.cross_host import CrossHost, GlooCrossHost, make_cross_host
from tensorxfer.distributed.failures import FailureReporter
from tensorxfer.distributed.hierarchical import HostCollectives, reducible
from tensorxfer.distributed.other_devices import OtherDevices, device_types
from tensorxfer.distributed.topology import Topology, probe, spin_us_for_machine
from tensorxfer.distributed.torch_private import AllgatherOptions
from tensorxfer.distributed.work import CompletionThread, OpThread, Work
from tensorxfer.runtime import Communicator, LocalGroup

#: Groups not shut down yet. torch's registry keeps a group alive until
#: destroy_process_group(), so a program that exits without it would leave the
#: local group's segment in /dev/shm: these are shut down at exit instead.
_live_groups: "weakref.WeakSet[TensorxferProcessGroup]" = weakref.WeakSet()
#: How long a failed group's shutdown waits for the other survivors to read who died.
FAILURE_READ_S = 5.0


def _shut_down_live_groups() -> None:
    for group in list(_live_groups):
        try:
            group.shutdown(wait_s=1.0)
        except Exception:  # noqa: BLE001 - exiting anyway
            pass


atexit.register(_shut_down_live_groups)
# multiprocessing children leave through os._exit, after running these finalizers.
multiprocessing.util.Finalize(None, _shut_down_live_groups, exitpriority=100)


def _data(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``, or where it requires grad (DDP with ``create_graph=True``) a detached view of its
    storage: the shared-memory collectives take tensors through DLPack, which refuses those."""
    return tensor.detach() if tensor.requires_grad else tensor


def _contiguous_run(tensor: torch.Tensor, body: Callable[[torch.Tensor], None]) -> None:
    """Runs ``body`` on ``tensor`` or, when not contiguous, on a copy that is then copied back."""
    if tensor.is_contiguous():
        body(tensor)
    else:
        staging = tensor.contiguous()
        body(staging)
        tensor.copy_(staging)


class TensorxferProcessGroup(dist.ProcessGroup):  # type: ignore[misc]
    """See the module docstring. Made by ``init_process_group("tensorxfer")`` or ``new_group(backend="tensorxfer")``."""

    def __init__(self, store: Any, rank: int, world_size: int, timeout: timedelta) -> None:
        super().__init__(rank, world_size)
        self._timeout = timeout
        self._timeout_s = timeout.total_seconds()
        self._store = PrefixStore("tensorxfer/", store)
        self._base_store = store
        self._gloo = ProcessGroupGloo(PrefixStore("gloo/", self._store), rank, world_size, timeout)
        self.topology: Topology = probe(PrefixStore("topology/", self._store), rank, world_size, self._timeout_s)
        self._group = self._join_local_group()
        self._spin_us = spin_us_for_machine(self._store, rank, world_size, len(self.topology.local_ranks))
        self._comm = Communicator(self._group, timeout=self._timeout_s, spin_us=self._spin_us)
        # Async ops (DDP's buckets) overlap with the caller's compute: their waits sleep at once, as
        # spinning takes the CPU from backward (2 ranks on 2 CPUs, 25M-parameter DDP step: 1.41x gloo
        # sleeping, 1.02-1.12x spinning; a 20 us yielding spin: 212-251 ms against 182-188 ms). Sync
        # ops spin (sleeping made back-to-back 64 MiB all-reduces 1.4x slower). One communicator, its
        # waits set per op (rank-local), so ranks that disagree on async_op still meet.
        self._waits_sleep = self._spin_us == 0.0
        self.cross_host: Optional[CrossHost] = make_cross_host(self._store, self.topology, timeout)
        self._host = HostCollectives(self.topology, self._comm, self.cross_host, self._timeout_s)
        self._other_devices = OtherDevices(PrefixStore("device-", self._store), rank, world_size, timeout)
        failures = FailureReporter(self._store, self.topology, self._group, self._release_shared_memory)
        self._failures = failures
        if isinstance(self.cross_host, GlooCrossHost):
            self.cross_host.watch = failures.raise_if_published
        self._ops = OpThread(f"tensorxfer-pg-{rank}", failures.on_op_failure, on_idle=lambda: self._use_waits(sleep=False))
        self._p2p = CompletionThread(f"tensorxfer-p2p-{rank}", failures.on_op_failure)
        self._closed = False
        #: Ops handed to the gloo group so far (what this backend does not accelerate).
        self.delegated_ops = 0
        _live_groups.add(self)

    # ---- construction ------------------------------------------------------------

    def _join_local_group(self) -> LocalGroup:
        leader = self.topology.local_ranks[0]
        key = f"local-group/{leader}"
        if self.rank() == leader:
            self._store.set(key, f"tdist-{secrets.token_hex(12)}")
        name = bytes(self._store.get(key)).decode("ascii")
        return LocalGroup.join(name, rank=self.topology.local_rank,
                               world_size=len(self.topology.local_ranks), timeout=self._timeout_s)

    def _release_shared_memory(self) -> None:
        for resource in (self._comm, self._group):
            try:
                resource.close()
            except Exception:  # noqa: BLE001
                pass

    # ---- dispatch ----------------------------------------------------------------

    def _device_group(self, tensors: List[torch.Tensor], op: str) -> Optional[Any]:
        """None for CPU tensors; for another device, the process group named for it (else raises)."""
        for tensor in tensors:
            if not tensor.is_cpu:
                return self._other_devices.group_for(tensors, op, str(dist.get_backend(self)))
        return None

    def _use_waits(self, sleep: bool) -> None:
        """Sets the waits for the op that starts now: sleeping (async ops) or the spin budget. While
        nothing is queued they spin (on_idle), so an op run on the caller's thread sets nothing."""
        if sleep != self._waits_sleep:
            self._comm.spin_us = 0.0 if sleep else self._spin_us
            self._waits_sleep = sleep

    def _submit(self, op: str, outputs: List[Any], tensors: List[torch.Tensor],
                accelerated: Optional[Callable[[], None]], delegated: Callable[[Any], Any], opts: Any) -> Any:
        """Queues ``accelerated()`` (when not None) or ``delegated(gloo).wait()``; returns the work.

        With ``opts.asyncOp`` False (torch's ``async_op=False``) the caller waits at
        once: the op runs on its thread when none is queued (no hand-off).
        """
        if self._closed:
            raise RuntimeError(f"tensorxfer backend: {op} on a process group that was shut down")
        other = self._device_group(tensors, op)
        if other is not None:
            return delegated(other)
        if accelerated is None:
            self.delegated_ops += 1
            run: Callable[[], None] = lambda: delegated(self._gloo).wait()  # noqa: E731
        else:
            run = accelerated
        asynchronous = opts.asyncOp
        if not asynchronous:
            done = self._ops.run_now(op, outputs, run)
            if done is not None:
                return done

        def body(work: Work) -> None:
            if accelerated is not None:
                self._use_waits(sleep=asynchronous)
            run()
            work.finish()

        return self._ops.submit(op, outputs, body)

    def _submit_p2p(self, op: str, tensors: List[torch.Tensor], start: Callable[[Any], Any]) -> Work:
        if self._closed:
            raise RuntimeError(f"tensorxfer backend: {op} on a process group that was shut down")
        other = self._device_group(tensors, op)
        if other is not None:
            return start(other)
        receives = op == "recv"

        def body(work: Work) -> None:
            self._p2p.finish_when_done(start(self._gloo), work, receives)

        return self._ops.submit(op, tensors, body)

    # ---- identity ----------------------------------------------------------------

    def getBackendName(self) -> str:
        return BACKEND_NAME

    # torch keeps these on the backends it registers; a Python group keeps its own.
    def _set_group_name(self, name: str) -> None:
        self._group_name = name

    def getGroupName(self) -> str:
        return getattr(self, "_group_name", "")

    def _set_group_desc(self, desc: str) -> None:
        self._group_desc = desc

    def getGroupDesc(self) -> str:
        return getattr(self, "_group_desc", "")

    @property
    def _device_types(self) -> List[torch.device]:
        """The device types this group takes: torch's barrier, object collectives and state-dict helpers choose
        their device from it (torch's own answer for a Python group is empty, and ``_get_pg_default_device`` raises)."""
        try:
            config = str(dist.get_backend_config(self))
        except (ValueError, RuntimeError):  # not (yet) in torch's registry of groups
            config = BACKEND_NAME
        return device_types(config)

    @property
    def local_group(self) -> LocalGroup:
        """This host's ranks (LocalGroup ranks are local indices: ``topology.local_ranks[i]`` is rank i's global rank)."""
        return self._group

    # ---- collectives: accelerated where the module docstring says -----------------

    def allreduce(self, tensors: List[torch.Tensor], opts: Any = None) -> Work:
        opts = opts if isinstance(opts, dist.AllreduceOptions) else _allreduce_options(opts)
        host = self._host
        run = None
        if len(tensors) == 1:
            tensor = tensors[0]
            op = reducible(tensor, opts.reduceOp)
            if op is not None and tensor.is_contiguous() and not tensor.requires_grad:
                run = lambda: host.all_reduce(tensor, op)  # noqa: E731
            elif op is not None and tensor.layout == torch.strided:  # sparse ones go to gloo
                run = lambda: _contiguous_run(_data(tensor), lambda t: host.all_reduce(t, op))  # noqa: E731
        return self._submit("all_reduce", tensors, tensors, run, lambda g: g.allreduce(tensors, opts), opts)

    def allreduce_coalesced(self, tensors: List[torch.Tensor], opts: Any = None) -> Work:
        opts = opts if opts is not None else dist.AllreduceCoalescedOptions()
        host = self._host
        ops = {reducible(t, opts.reduceOp) for t in tensors}
        same_dtype = len({t.dtype for t in tensors}) <= 1
        run = None
        if tensors and same_dtype and None not in ops:
            op: str = ops.pop()  # type: ignore[assignment]  # None is not in ops here

            def run() -> None:
                flat = torch.cat([_data(t).reshape(-1) for t in tensors])
                host.all_reduce(flat, op)
                for tensor, part in zip(tensors, flat.split([t.numel() for t in tensors])):
                    _data(tensor).copy_(part.view_as(tensor))

        return self._submit("all_reduce_coalesced", tensors, tensors, run,
                            lambda g: g.allreduce_coalesced(tensors, opts), opts)

    def reduce(self, tensors: List[torch.Tensor], opts: Any) -> Work:
        host = self._host
        op = reducible(tensors[0], opts.reduceOp) if len(tensors) == 1 else None
        run = None
        if op is not None:
            def run() -> None:
                result = _data(tensors[0]).contiguous().clone()
                host.all_reduce(result, op)
                if self.rank() == opts.rootRank:
                    _data(tensors[0]).copy_(result)

        return self._submit("reduce", tensors, tensors, run, lambda g: g.reduce(tensors, opts), opts)

    def allgather(self, output_lists: List[List[torch.Tensor]], inputs: List[torch.Tensor], opts: Any = None) -> Work:
        opts = opts if opts is not None else AllgatherOptions()
        host = self._host
        run = None
        if len(inputs) == 1:
            def run() -> None:
                source = _data(inputs[0]).contiguous()
                gathered = torch.empty((self.size(),) + tuple(source.shape), dtype=source.dtype)
                host.all_gather(gathered, source)
                for output, part in zip(output_lists[0], gathered):
                    _data(output).copy_(part)

        return self._submit("all_gather", output_lists, inputs, run, lambda g: g.allgather(output_lists, inputs, opts), opts)

    def _allgather_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Work:
        opts = opts if opts is not None else AllgatherOptions()
        host = self._host

        def run() -> None:
            _contiguous_run(_data(output), lambda out: host.all_gather(out, _data(input).contiguous()))

        return self._submit("all_gather_into_tensor", [output], [output, input], run,
                            lambda g: g._allgather_base(output, input, opts), opts)

    all_gather_single = _allgather_base

    def _each_pair(self, single: Callable[..., Work], outputs: List[torch.Tensor], inputs: List[torch.Tensor],
                   opts: Any) -> Work:
        """A coalesced op as its single ops in order; the last one's work (in-order completion)."""
        works = [single(o, i, opts) for o, i in zip(outputs, inputs)]
        return works[-1] if works else self.barrier()

    def all_gather_single_coalesced(self, outputs: List[torch.Tensor], inputs: List[torch.Tensor], opts: Any = None) -> Work:
        return self._each_pair(self._allgather_base, outputs, inputs, opts)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def allgather_coalesced(self, output_lists: List[List[torch.Tensor]], inputs: List[torch.Tensor], opts: Any = None) -> Work:
        opts = opts if opts is not None else AllgatherOptions()
        return self._submit("all_gather_coalesced", output_lists, inputs, None,
                            lambda g: g.allgather_coalesced(output_lists, inputs, opts), opts)

    def reduce_scatter(self, outputs: List[torch.Tensor], input_lists: List[List[torch.Tensor]], opts: Any = None) -> Work:
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        host = self._host
        op = reducible(outputs[0], opts.reduceOp) if len(outputs) == 1 else None
        run = None
        if op is not None:
            def run() -> None:
                flat = torch.cat([_data(part).reshape(-1) for part in input_lists[0]])
                _contiguous_run(_data(outputs[0]), lambda out: host.reduce_scatter(out, flat, op))

        return self._submit("reduce_scatter", outputs, outputs + input_lists[0], run,
                            lambda g: g.reduce_scatter(outputs, input_lists, opts), opts)

    def _reduce_scatter_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Work:
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        host = self._host
        op = reducible(output, opts.reduceOp)
        run = None
        if op is not None:
            def run() -> None:
                _contiguous_run(_data(output), lambda out: host.reduce_scatter(out, _data(input).contiguous(), op))

        return self._submit("reduce_scatter_tensor", [output], [output, input], run,
                            lambda g: g._reduce_scatter_base(output, input, opts), opts)

    reduce_scatter_single = _reduce_scatter_base

    def reduce_scatter_single_coalesced(self, outputs: List[torch.Tensor], inputs: List[torch.Tensor], opts: Any = None) -> Work:
        return self._each_pair(self._reduce_scatter_base, outputs, inputs, opts)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def broadcast(self, tensors: List[torch.Tensor], opts: Any = None) -> Work:
        opts = opts if opts is not None else dist.BroadcastOptions()
        host = self._host
        run = None
        if len(tensors) == 1:
            def run() -> None:
                _contiguous_run(_data(tensors[0]), lambda t: host.broadcast(t, opts.rootRank))

        return self._submit("broadcast", tensors, tensors, run, lambda g: g.broadcast(tensors, opts), opts)

    def barrier(self, opts: Any = None) -> Work:
        opts = opts if opts is not None else dist.BarrierOptions()
        host = self._host
        return self._submit("barrier", [], [], host.barrier, lambda g: g.barrier(opts), opts)

    # ---- delegated to gloo ----------------------------------------------------------

    def gather(self, output_lists: List[List[torch.Tensor]], inputs: List[torch.Tensor], opts: Any) -> Work:
        return self._submit("gather", output_lists, inputs, None, lambda g: g.gather(output_lists, inputs, opts), opts)

    def scatter(self, outputs: List[torch.Tensor], input_lists: List[List[torch.Tensor]], opts: Any) -> Work:
        return self._submit("scatter", outputs, outputs, None, lambda g: g.scatter(outputs, input_lists, opts), opts)

    def alltoall(self, outputs: List[torch.Tensor], inputs: List[torch.Tensor], opts: Any = None) -> Work:
        opts = opts if opts is not None else dist.AllToAllOptions()
        return self._submit("all_to_all", outputs, outputs + inputs, None, lambda g: g.alltoall(outputs, inputs, opts), opts)

    def alltoall_base(self, output: torch.Tensor, input: torch.Tensor, output_splits: List[int],
                      input_splits: List[int], opts: Any = None) -> Work:
        opts = opts if opts is not None else dist.AllToAllOptions()
        return self._submit("all_to_all_single", [output], [output, input], None,
                            lambda g: g.alltoall_base(output, input, output_splits, input_splits, opts), opts)

    all_to_all_single = alltoall_base

    def send(self, tensors: List[torch.Tensor], dst: int, tag: int = 0) -> Work:
        return self._submit_p2p("send", tensors, lambda g: g.send(tensors, dst, tag))

    def recv(self, tensors: List[torch.Tensor], src: int, tag: int = 0) -> Work:
        return self._submit_p2p("recv", tensors, lambda g: g.recv(tensors, src, tag))

    def recv_anysource(self, tensors: List[torch.Tensor], tag: int = 0) -> Work:
        return self._submit_p2p("recv", tensors, lambda g: g.recv_anysource(tensors, tag))

    # ---- lifetime --------------------------------------------------------------------

    def shutdown(self, wait_s: Optional[float] = None) -> None:
        """Finishes queued ops (waiting up to ``wait_s``, default the group's timeout), then unmaps
        the shared memory. ``destroy_process_group`` calls it."""
        if self._closed:
            return
        self._closed = True
        _live_groups.discard(self)
        wait_s = self._timeout_s if wait_s is None else wait_s
        stopped = self._ops.stop(wait_s) and self._p2p.stop(wait_s)
        if self._ops.failure is not None:  # the store may live in this process: let the others read it first
            self._failures.wait_until_read(min(wait_s, FAILURE_READ_S))
        if stopped:  # a thread still inside a native wait keeps using the memory: leave it to exit
            self._release_shared_memory()

    def abort(self) -> None:
        self.shutdown()


def _allreduce_options(op: Any) -> Any:
    options = dist.AllreduceOptions()
    if op is not None:
        options.reduceOp = op
    return options
