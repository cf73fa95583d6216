"""
tensorxfer native core (C++); use the tensorxfer package, not this module
"""
from __future__ import annotations
import collections.abc
import numpy
import numpy.typing
import typing
__all__: list[str] = ['Communicator', 'CopyEngine', 'CudaAllReduce', 'CudaCopySubmitter', 'HostBlock', 'HostEvent', 'HostPool', 'HostStream', 'IpcMemory', 'LocalGroup', 'PackLayout', 'PersistentSteps', 'PipelineExecutor', 'PipelinePlan', 'SharedSegment', 'SlotRing', 'StreamMessages', 'StreamViews', 'SubmitSide', 'TensorView', 'allow_memory_readers', 'best_half_kernels', 'bind_to_numa_node', 'build_info', 'build_local_steps', 'build_transfer_schedule', 'check_pipeline_batch', 'check_pipeline_plan', 'check_timeout', 'choose_all_reduce_algorithm', 'communicator_required_nbytes', 'copy_spans', 'cpu_features', 'cuda_concurrent_managed_access', 'cuda_copy_compiled', 'cuda_copy_spans', 'cuda_host_register', 'cuda_host_unregister', 'cuda_is_managed_pointer', 'cuda_put', 'cuda_runtime_calls', 'cuda_span_piece_bytes', 'cuda_status', 'current_numa_node', 'current_process_identity', 'describe_spans', 'describe_torch_tensors', 'find_task_pairs', 'half_kernel_sets', 'huge_page_bytes', 'huge_page_size', 'make_view', 'managed_advise_accessed_by', 'managed_advise_preferred_location', 'managed_prefetch', 'message_sizes', 'numa_nodes_of', 'numa_nodes_with_memory', 'numa_online_nodes', 'numa_policy_of', 'numa_supported', 'numa_unsupported_reason', 'pack_rows', 'pack_spans', 'page_size', 'pipeline_region_nbytes', 'plan_pipeline', 'populate_host_pages', 'prefer_local_numa_node', 'probe_futex_across_processes', 'probe_numa_system_calls', 'probe_process_memory', 'process_is_alive', 'read_process_spans', 'reduce_elements', 'require_contiguous_host', 'resident_page_count', 'sweep_stale_segments', 'unpack_spans', 'uvm_free_symbol', 'uvm_last_error_symbol', 'uvm_malloc_symbol']
class TensorView:
    """
    A view of a tensor's memory that keeps its owner alive (and holds the buffer export of buffer-protocol objects, so they cannot be resized).
    """
    def __repr__(self) -> str:
        ...
    def describe(self) -> str:
        ...
    @property
    def data_ptr(self) -> int:
        ...
    @property
    def device(self) -> str:
        ...
    @property
    def dtype(self) -> str:
        ...
    @property
    def is_contiguous(self) -> bool:
        ...
    @property
    def is_host(self) -> bool:
        ...
    @property
    def nbytes(self) -> int:
        ...
    @property
    def owner(self) -> typing.Any:
        ...
    @property
    def readonly(self) -> bool:
        ...
    @property
    def shape(self) -> tuple:
        ...
    @property
    def strides(self) -> tuple:
        ...
class HostBlock:
    """
    Page-aligned host memory on loan from a HostPool (a writable uint8 buffer).
    """
    def __repr__(self) -> str:
        ...
    @property
    def data_ptr(self) -> int:
        ...
    @property
    def huge_pages(self) -> str:
        ...
    @property
    def huge_pages_note(self) -> str:
        ...
    @property
    def lock_error(self) -> str:
        ...
    @property
    def locked(self) -> bool:
        ...
    @property
    def mapped_bytes(self) -> int:
        ...
    @property
    def nbytes(self) -> int:
        ...
    @property
    def reused(self) -> bool:
        ...
class HostPool:
    """
    Native pool of page-aligned host blocks.
    """
    def __init__(self, *, huge_pages: bool = False, lock_pages: bool = False, numa_node: typing.SupportsInt | typing.SupportsIndex = -1, max_cached_bytes: typing.SupportsInt | typing.SupportsIndex = 268435456) -> None:
        ...
    def allocate(self, nbytes: typing.SupportsInt | typing.SupportsIndex) -> HostBlock:
        ...
    def close(self) -> None:
        ...
    def release_cached(self) -> None:
        ...
    def stats(self) -> dict:
        ...
    @property
    def closed(self) -> bool:
        ...
    @property
    def huge_pages(self) -> bool:
        ...
    @property
    def lock_pages(self) -> bool:
        ...
    @property
    def max_cached_bytes(self) -> int:
        ...
    @property
    def numa_node(self) -> int:
        ...
class HostEvent:
    """
    A marker recorded on a HostStream: done once the work enqueued before the record has run.
    """
    def __init__(self) -> None:
        ...
    def query(self) -> bool:
        """
        True if never recorded or the latest record is done. Never blocks.
        """
    def reset(self) -> None:
        """
        Back to never recorded.
        """
    def wait(self, timeout: float | None = None) -> None:
        """
        Blocks until the latest record is done (GIL released). ``timeout``: seconds, 0 = check once, None = no deadline (Ctrl-C still interrupts: KeyboardInterrupt). Raises TimeoutError, or the error of a failed task before the record.
        """
class HostStream:
    """
    A worker thread running a FIFO of host copies, event records and event waits, CUDA-stream style.
    """
    def __enter__(self) -> typing.Any:
        ...
    def __exit__(self, *args) -> None:
        ...
    def __init__(self, engine: typing.Any = None) -> None:
        """
        Copies go through `engine` (a CopyEngine, kept alive by the stream) when given, else a memcpy on the stream's thread.
        """
    def close(self, timeout: float | None = 30.0) -> None:
        """
        Stops accepting work, lets pending work run for up to `timeout` seconds (None: no deadline), cancels the rest (TimeoutError then) and joins the worker. Idempotent. Ctrl-C during the wait raises KeyboardInterrupt; the work keeps running and close may be called again.
        """
    def enqueue_copy(self, dst: typing.Any, src: typing.Any) -> None:
        """
        Queues a copy of src's bytes into dst and returns at once. The stream keeps both tensors alive until the copy is done. ValueError for size mismatch, non-host, non-contiguous or read-only dst, or a closed stream.
        """
    def query(self) -> bool:
        """
        True when everything enqueued has run. Never blocks.
        """
    def record(self, event: HostEvent) -> None:
        """
        Records `event`: done once everything enqueued before has run.
        """
    def synchronize(self, timeout: float | None = None) -> None:
        """
        Blocks until everything enqueued so far has run (GIL released). ``timeout``: seconds, 0 = check once, None = no deadline (Ctrl-C still interrupts: KeyboardInterrupt). Raises TimeoutError, or the error of a failed task (once).
        """
    def wait_event(self, event: HostEvent) -> None:
        """
        Work enqueued after this waits for `event`'s latest record.
        """
    @property
    def _pending_owners(self) -> int:
        """
        Tensors held for copies not yet seen finished (for tests).
        """
    @property
    def closed(self) -> bool:
        ...
    @property
    def completed_sequence(self) -> int:
        """
        Every task numbered up to this has finished.
        """
    @property
    def enqueued_sequence(self) -> int:
        """
        Number of the latest enqueued task, or 0 if none was.
        """
class CopyEngine:
    """
    Worker threads that split large host copies and row packing with the calling thread. Pass one to HostStream / pack_rows; no global engine.
    """
    def __init__(self, num_threads: typing.SupportsInt | typing.SupportsIndex = 0, *, idle_spin_us: typing.SupportsInt | typing.SupportsIndex = 50) -> None:
        """
        Starts `num_threads` workers (0 = one fewer than the usable CPUs, at least 1: the caller works too). While calls come back to back (each within `idle_spin_us` of the end of the one before), a worker polls that long for the next before sleeping; 0 = workers always sleep between calls.
        """
    def copy(self, dst: typing.Any, src: typing.Any) -> None:
        """
        Copies src's bytes into dst and returns when done (GIL released). Both contiguous host tensors of equal byte size, dst writable; ValueError otherwise.
        """
    @property
    def idle_spin_us(self) -> int:
        """
        How long a worker polls for the next call while calls come back to back (microseconds).
        """
    @property
    def max_parallelism(self) -> int:
        """
        Threads (workers + caller) that share one copy at most.
        """
    @property
    def num_threads(self) -> int:
        """
        Worker threads owned.
        """
    @property
    def parallel_threshold(self) -> int:
        """
        Copies below this many bytes run on the calling thread alone.
        """
class PackLayout:
    """
    Native packed-row layout; use tensorxfer.ipc.PackLayout instead.
    """
    def __init__(self, fields: collections.abc.Sequence[tuple[str, str, collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex]]], rows: typing.SupportsInt | typing.SupportsIndex) -> None:
        """
        fields: [(name, dtype name, row shape)], in packing order.
        """
    @property
    def fields(self) -> list:
        """
        [(name, dtype name, row shape, byte offset, row bytes)] in packing order.
        """
    @property
    def nbytes(self) -> int:
        ...
    @property
    def rows(self) -> int:
        ...
class SharedSegment:
    """
    A POSIX shared-memory segment with a validated header (tensorxfer/memory/shm_segment.h).
    """
    @staticmethod
    def attach(name: str, kind: str) -> SharedSegment:
        """
        Map an existing segment, validating its header and kind.
        """
    @staticmethod
    def create(nbytes: typing.SupportsInt | typing.SupportsIndex, kind: str) -> SharedSegment:
        """
        Create a segment of `nbytes` zeroed payload bytes.
        """
    def array(self) -> numpy.typing.NDArray[numpy.uint8]:
        """
        The payload as a uint8 numpy array; keeps the mapping alive.
        """
    def detach(self) -> None:
        """
        Drop this attachment (unlinks by the segment rules); memory stays mapped.
        """
    @property
    def attach_count(self) -> int:
        ...
    @property
    def detached(self) -> bool:
        ...
    @property
    def is_creator(self) -> bool:
        ...
    @property
    def name(self) -> str:
        ...
    @property
    def nbytes(self) -> int:
        ...
    @property
    def owner_alive(self) -> bool:
        ...
    @property
    def owner_pid(self) -> int:
        ...
class SlotRing:
    """
    A ring of shared slots (tensorxfer/ipc/slot_ring.h).
    """
    @staticmethod
    def attach(name: str, spin_us: typing.SupportsFloat | typing.SupportsIndex | None = None) -> SlotRing:
        ...
    @staticmethod
    def create(depth: typing.SupportsInt | typing.SupportsIndex, slot_nbytes: typing.SupportsInt | typing.SupportsIndex, spin_us: typing.SupportsFloat | typing.SupportsIndex | None = None, max_producers: typing.SupportsInt | typing.SupportsIndex = 64) -> SlotRing:
        ...
    def abandon(self, slot: typing.SupportsInt | typing.SupportsIndex) -> None:
        """
        Hand a slot from acquire_free back unpublished.
        """
    def acquire_free(self, timeout: float | None = None) -> int:
        ...
    def acquire_ready(self, timeout: float | None = None) -> tuple:
        """
        -> (slot, tick_id); its publish time: last_publish_ns
        """
    def close(self) -> None:
        ...
    def publish(self, slot: typing.Any, tick_id: typing.Any) -> None:
        """
        slot in [0, depth), tick_id in [0, 2**64)
        """
    def release(self, slot: typing.Any) -> None:
        ...
    def report_peer_lost(self, message: str) -> None:
        """
        Consumer: the next acquire_ready raises PeerLostError(message) once, taking nothing.
        """
    def slot_array(self, slot: typing.SupportsInt | typing.SupportsIndex) -> numpy.typing.NDArray[numpy.uint8]:
        """
        The slot's bytes as a uint8 numpy array; keeps the mapping alive.
        """
    def try_acquire_free(self) -> int | None:
        ...
    def try_acquire_ready(self) -> typing.Any:
        """
        -> (slot, tick_id) or None
        """
    @property
    def closed(self) -> bool:
        ...
    @property
    def current_spin_us(self) -> float:
        ...
    @property
    def depth(self) -> int:
        ...
    @property
    def is_consumer(self) -> bool:
        ...
    @property
    def last_publish_ns(self) -> int:
        ...
    @property
    def live_producers(self) -> int:
        ...
    @property
    def max_producers(self) -> int:
        ...
    @property
    def name(self) -> str:
        ...
    @property
    def skipped_sequences(self) -> int:
        ...
    @property
    def slot_nbytes(self) -> int:
        ...
    @property
    def spin_us(self) -> float | None:
        ...
    @spin_us.setter
    def spin_us(self, arg1: typing.SupportsFloat | typing.SupportsIndex | None) -> None:
        ...
    @property
    def wait_stats(self) -> dict:
        ...
class LocalGroup:
    """
    Native LocalGroup (see tensorxfer.runtime.LocalGroup, which wraps it).
    """
    default_max_gather_nbytes: typing.ClassVar[int] = 268435456
    mailbox_nbytes: typing.ClassVar[int] = 65536
    max_name_nbytes: typing.ClassVar[int] = 200
    max_world_size: typing.ClassVar[int] = 1024
    @staticmethod
    def join(name: str, rank: typing.SupportsInt | typing.SupportsIndex, world_size: typing.SupportsInt | typing.SupportsIndex, timeout: float | None = None) -> LocalGroup:
        ...
    def abandon(self) -> None:
        """
        Marks this rank as having given up its collectives: peers' waits end with PeerLostError.
        """
    def all_gather_bytes(self, data: bytes, timeout: float | None = None, max_nbytes: typing.SupportsInt | typing.SupportsIndex = 268435456) -> list:
        """
        Every rank's bytes in rank order; a contribution above max_nbytes is refused on every rank.
        """
    def barrier(self, timeout: float | None = None) -> None:
        ...
    def check_peers(self) -> None:
        ...
    def close(self) -> None:
        """
        Leaves the group; a wait on another thread ends with ClosedError first.
        """
    def rank_alive(self, rank: typing.SupportsInt | typing.SupportsIndex) -> bool:
        ...
    @property
    def closed(self) -> bool:
        ...
    @property
    def name(self) -> str:
        ...
    @property
    def rank(self) -> int:
        ...
    @property
    def world_size(self) -> int:
        ...
class IpcMemory:
    """
    Per-rank data regions and barrier words mapped by every rank (tensorxfer/collectives/ipc_memory.h).
    """
    @staticmethod
    def create_local(rank: typing.SupportsInt | typing.SupportsIndex, world_size: typing.SupportsInt | typing.SupportsIndex, nbytes: typing.SupportsInt | typing.SupportsIndex, device: str = 'cpu', cuda_device: typing.SupportsInt | typing.SupportsIndex = -1) -> IpcMemory:
        """
        Step 1: this rank's region (zeroed).
        """
    def check_peers_alive(self) -> None:
        ...
    def close(self) -> None:
        ...
    def close_peer_mappings(self) -> None:
        ...
    def map_peers(self, handles: collections.abc.Sequence[bytes]) -> None:
        """
        Step 2: map every rank's region; handles in rank order.
        """
    def region(self, rank: typing.SupportsInt | typing.SupportsIndex) -> numpy.typing.NDArray[numpy.uint8]:
        """
        Rank `rank`'s data region as a uint8 numpy array (keeps the mapping alive).
        """
    def release_handles(self) -> None:
        """
        Step 3, after a group barrier: unlink this rank's name.
        """
    @property
    def barrier_flag(self) -> int:
        ...
    @property
    def barrier_in(self) -> list[int]:
        ...
    @property
    def barrier_out(self) -> list[int]:
        ...
    @property
    def closed(self) -> bool:
        ...
    @property
    def device(self) -> str:
        ...
    @property
    def local_handle(self) -> bytes:
        """
        What peers pass to map_peers (bytes).
        """
    @property
    def mapped(self) -> bool:
        ...
    @property
    def nbytes(self) -> int:
        ...
    @property
    def num_workers(self) -> int:
        ...
    @property
    def remote_data(self) -> list[int]:
        ...
    @property
    def worker_id(self) -> int:
        ...
class Communicator:
    """
    Collectives over an IpcMemory (tensorxfer/collectives/communicator.h).
    """
    def __init__(self, memory: IpcMemory, max_bytes: typing.SupportsInt | typing.SupportsIndex, buffer_bytes: typing.SupportsInt | typing.SupportsIndex, peer_check: typing.Any = None, spin_us: typing.SupportsFloat | typing.SupportsIndex | None = None) -> None:
        """
        Takes over `memory` (which is left closed).
        """
    def all_gather(self, output: typing.Any, input: typing.Any, timeout: typing.Any = None) -> None:
        ...
    def all_reduce(self, tensor: typing.Any, op: str = 'sum', algorithm: str = 'auto', timeout: typing.Any = None) -> None:
        ...
    def barrier(self, timeout: typing.Any = None) -> None:
        ...
    def broadcast(self, tensor: typing.Any, src: typing.SupportsInt | typing.SupportsIndex, timeout: typing.Any = None) -> None:
        ...
    def buffer_array(self, rank: typing.SupportsInt | typing.SupportsIndex) -> numpy.typing.NDArray[numpy.uint8]:
        """
        Rank `rank`'s zero-copy buffer as a uint8 numpy array (keeps the mapping alive).
        """
    def close(self) -> None:
        ...
    def reduce_scatter(self, output: typing.Any, input: typing.Any, op: str = 'sum', timeout: typing.Any = None) -> None:
        ...
    @property
    def broken(self) -> bool:
        ...
    @property
    def buffer_nbytes(self) -> int:
        ...
    @property
    def closed(self) -> bool:
        ...
    @property
    def max_bytes(self) -> int:
        ...
    @property
    def memory(self) -> IpcMemory:
        ...
    @property
    def rank(self) -> int:
        ...
    @property
    def spin_us(self) -> float:
        """
        The spin budget waits use now (us); set None for the standard policy, or a fixed budget.
        """
    @spin_us.setter
    def spin_us(self, arg1: typing.SupportsFloat | typing.SupportsIndex | None) -> None:
        ...
    @property
    def world_size(self) -> int:
        ...
class CudaCopySubmitter:
    """
    Native cudaMemcpyAsync host-to-device submitter for one GPU.
    """
    def __init__(self, device: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    def copy_host_to_device(self, dst: typing.SupportsInt | typing.SupportsIndex, src: typing.SupportsInt | typing.SupportsIndex, nbytes: typing.SupportsInt | typing.SupportsIndex, stream: typing.SupportsInt | typing.SupportsIndex) -> None:
        """
        Queues cudaMemcpyAsync(dst, src, nbytes, HostToDevice) on `stream` (GIL released).
        """
    def order_after(self, stream: typing.SupportsInt | typing.SupportsIndex, waited_stream: typing.SupportsInt | typing.SupportsIndex) -> None:
        """
        Makes `stream` wait on the device for the work queued on `waited_stream` so far.
        """
    @property
    def device(self) -> int:
        ...
class CudaAllReduce:
    """
    All-reduce of CUDA tensors over every rank's mapped IpcMemory(device='cuda').
    """
    one_shot_max_bytes: typing.ClassVar[int] = 524288
    def __init__(self, *, rank: typing.SupportsInt | typing.SupportsIndex, world_size: typing.SupportsInt | typing.SupportsIndex, cuda_device: typing.SupportsInt | typing.SupportsIndex, data: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex], barrier_in: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex], barrier_out: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex], data_nbytes: typing.SupportsInt | typing.SupportsIndex, timeout: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    def all_reduce(self, tensor: typing.SupportsInt | typing.SupportsIndex, count: typing.SupportsInt | typing.SupportsIndex, dtype: str, op: str, algorithm: str, stream: typing.SupportsInt | typing.SupportsIndex) -> None:
        """
        Queues the in-place all-reduce of `count` elements at `tensor` on `stream`.
        """
    def throw_if_failed(self) -> None:
        """
        Raises TimeoutError or ValueError naming the peer when the GPU recorded a failure.
        """
    @property
    def status(self) -> int:
        """
        The failure the GPU recorded (kind << 32 | peer rank), 0 for none.
        """
class SubmitSide:
    """
    One direction of a copy service's submit queue, with a native submit (copy_services/_queue.py).
    """
    @staticmethod
    def __new__(type, *args, **kwargs):
        """
        Create and return a new object.  See help(type) for accurate signature.
        """
    def __len__(self):
        """
        Return len(self).
        """
    def append(self, task_id, tensor, rank):
        """
        Queue an op as it is (described where this side can).
        """
    def clear(self):
        """
        Empties the columns (the same lists).
        """
    def insert(self, position, task_id, tensor, rank):
        """
        Queue an op before position (0 <= position <= len).
        """
    def op(self, position):
        """
        (task_id, tensor, rank) of the op at position (0 <= position < len).
        """
    def remove(self, position):
        """
        Drop the op at position and its description.
        """
    def set(self, position, task_id, tensor, rank):
        """
        Replace the op at position (its description taken anew).
        """
    def set_checks(self, tensor_type, array_type, low, high, host_only):
        """
        What submit() takes without the fallback.
        """
    def submit(self, tensor, rank, task_id = None):
        """
        Queue one op (the fallback checks anything but the common case).
        """
    def take(self):
        """
        (ids, tensors, ranks, rows) of the queued ops, leaving this side empty; rows: (n, 3) uint64 of (address, nbytes, flags) as describe_spans, flag 8 where not described.
        """
class StreamMessages:
    """
    One side's messages of one stream (native).
    """
    def copy(self, k: typing.SupportsInt | typing.SupportsIndex, engine: CopyEngine) -> None:
        """
        Packs message k into its staging buffer (a send side) or unpacks it from there (a receive side); nothing for a direct message. On `engine`'s threads and the caller, or the caller alone (None). GIL released.
        """
    @property
    def count(self) -> int:
        ...
    @property
    def direct(self) -> numpy.typing.NDArray[numpy.uint64]:
        """
        Each message's address in the user's memory (sent from / received into), 0 = staged.
        """
    @property
    def nbytes(self) -> numpy.typing.NDArray[numpy.uint64]:
        ...
class StreamViews:
    """
    Every view's pieces of one side of a plan (native).
    """
    def __init__(self, meta: typing.Annotated[numpy.typing.ArrayLike, numpy.uint64], dims: typing.Annotated[numpy.typing.ArrayLike, numpy.int64], side: str) -> None:
        """
        From describe_views' (meta, dims); side is 'sends' or 'receives'.
        """
    def messages(self, items: typing.Annotated[numpy.typing.ArrayLike, numpy.uint64], sizes: typing.Annotated[numpy.typing.ArrayLike, numpy.uint64], staging: typing.Annotated[numpy.typing.ArrayLike, numpy.uint64], staging_nbytes: typing.SupportsInt | typing.SupportsIndex, streaming: bool, keep_alive: typing.Any) -> StreamMessages:
        """
        The stream's messages; staged message k goes through staging[k % len(staging)] (addresses of buffers of staging_nbytes, kept alive by keep_alive with the views' memory); `streaming` writes copies with streaming stores.
        """
    def staged_count(self, items: typing.Annotated[numpy.typing.ArrayLike, numpy.uint64], sizes: typing.Annotated[numpy.typing.ArrayLike, numpy.uint64]) -> int:
        """
        How many messages of the stream of these views (by index, in order) cut at `sizes` need staging.
        """
class PipelinePlan:
    """
    One rank's iterations of a transfer schedule (native).
    """
    @staticmethod
    def from_iterations(iterations: list) -> PipelinePlan:
        """
        From [(send batch or None, receive batch or None), ...] per iteration.
        """
    @property
    def num_batches(self) -> int:
        ...
    @property
    def num_iterations(self) -> int:
        ...
class PersistentSteps:
    """
    A persistent plan's copy lists (native).
    """
    def copy_local(self, engine: CopyEngine) -> None:
        """
        Only the same-rank copies (a plan of one process), GIL released.
        """
    @property
    def bytes(self) -> int:
        ...
    @property
    def num_iterations(self) -> int:
        ...
    @property
    def num_spans(self) -> int:
        ...
class PipelineExecutor:
    """
    Double-buffered pack/send/unpack over an IpcMemory (resharding/pipeline_executor.h).
    """
    def __init__(self, memory: IpcMemory, group: LocalGroup, slot_nbytes: typing.SupportsInt | typing.SupportsIndex, engine: CopyEngine) -> None:
        ...
    def build_steps(self, plan: PipelinePlan | None, send_meta: typing.Annotated[numpy.typing.ArrayLike, numpy.uint64], send_dims: typing.Annotated[numpy.typing.ArrayLike, numpy.int64], recv_meta: typing.Annotated[numpy.typing.ArrayLike, numpy.uint64], recv_dims: typing.Annotated[numpy.typing.ArrayLike, numpy.int64], pipe_sends: typing.Annotated[numpy.typing.ArrayLike, numpy.uint64], pipe_recvs: typing.Annotated[numpy.typing.ArrayLike, numpy.uint64], local_pairs: typing.Annotated[numpy.typing.ArrayLike, numpy.uint64], direct: typing.Annotated[numpy.typing.ArrayLike, numpy.uint64], any_direct: bool, any_remote: bool, keep_alive: typing.Any) -> PersistentSteps:
        """
        A persistent plan's copy lists (resharding/persistent_plan.h) from this rank's views (meta rows (address, itemsize, ndim), dims rows (size, stride in bytes)), its pipeline tasks ((task id, op index) rows), same-rank pairs ((send, receive) op indices) and direct reads ((source address, receive, nbytes)); `keep_alive` is held as long as the result.
        """
    def check(self, plan: PipelinePlan) -> None:
        """
        The checks execute makes before anything moves, alone (ValueError naming the field).
        """
    def execute(self, plan: PipelinePlan, timeout: float | None = None, operation: typing.SupportsInt | typing.SupportsIndex = 0) -> None:
        """
        Runs the plan (collective); raises TimeoutError / PeerLostError from its barriers. Its barriers carry `operation` (the same on every rank, a new one per run): a barrier completed by ranks of different operations raises TensorxferError ('ranks out of step').
        """
    def execute_steps(self, steps: PersistentSteps, plan_id: typing.SupportsInt | typing.SupportsIndex, version: typing.SupportsInt | typing.SupportsIndex, run: typing.SupportsInt | typing.SupportsIndex, timeout: float | None = None) -> None:
        """
        One run of a persistent plan (collective when any rank moves bytes between processes), GIL released; TimeoutError / PeerLostError from its barriers, TensorxferError when ranks run different plans or versions.
        """
    def launch_pack(self, iteration: typing.SupportsInt | typing.SupportsIndex, batch: typing.Any) -> None:
        ...
    def launch_unpack(self, iteration: typing.SupportsInt | typing.SupportsIndex, batch: typing.Any) -> None:
        ...
    def set_task_memory(self, send_ids: typing.Annotated[numpy.typing.ArrayLike, numpy.uint64], send_addresses: typing.Annotated[numpy.typing.ArrayLike, numpy.uint64], send_nbytes: typing.Annotated[numpy.typing.ArrayLike, numpy.uint64], recv_ids: typing.Annotated[numpy.typing.ArrayLike, numpy.uint64], recv_addresses: typing.Annotated[numpy.typing.ArrayLike, numpy.uint64], recv_nbytes: typing.Annotated[numpy.typing.ArrayLike, numpy.uint64]) -> None:
        """
        Where each task's bytes live on this rank; the caller keeps that memory alive until the next call.
        """
    def synchronize(self) -> None:
        """
        Waits for launched packs and unpacks.
        """
def allow_memory_readers() -> bool:
    """
    Lets this user's other processes read this one's memory under Yama ptrace_scope 1.
    """
def best_half_kernels() -> str:
    """
    The kernel set the collectives use on this CPU.
    """
def bind_to_numa_node(view: TensorView, argument: str, node: typing.SupportsInt | typing.SupportsIndex) -> None:
    ...
def build_local_steps(send_meta: typing.Annotated[numpy.typing.ArrayLike, numpy.uint64], send_dims: typing.Annotated[numpy.typing.ArrayLike, numpy.int64], recv_meta: typing.Annotated[numpy.typing.ArrayLike, numpy.uint64], recv_dims: typing.Annotated[numpy.typing.ArrayLike, numpy.int64], local_pairs: typing.Annotated[numpy.typing.ArrayLike, numpy.uint64], keep_alive: typing.Any) -> PersistentSteps:
    """
    The copy lists of a plan of same-rank pairs only (PipelineExecutor.build_steps' form).
    """
def build_transfer_schedule(sends: typing.Annotated[numpy.typing.ArrayLike, numpy.int64], receives: typing.Annotated[numpy.typing.ArrayLike, numpy.int64], world_size: typing.SupportsInt | typing.SupportsIndex, slot_nbytes: typing.SupportsInt | typing.SupportsIndex, max_tasks_per_batch: typing.SupportsInt | typing.SupportsIndex) -> tuple[int, list]:
    """
    Schedule from all-gathered (task_id, nbytes, src_rank, dest_rank) rows: (num_iterations, [(src, dest, batch_index, iteration, total_nbytes, segments (n, 4) uint64), ...]).
    """
def check_pipeline_batch(batch: typing.Any, sending: bool, ids: typing.Annotated[numpy.typing.ArrayLike, numpy.uint64], addresses: typing.Annotated[numpy.typing.ArrayLike, numpy.uint64], nbytes: typing.Annotated[numpy.typing.ArrayLike, numpy.uint64], my_pe: typing.SupportsInt | typing.SupportsIndex, world_size: typing.SupportsInt | typing.SupportsIndex, slot_nbytes: typing.SupportsInt | typing.SupportsIndex) -> None:
    """
    check_pipeline_plan's checks of one batch, a send's (sending) or a receive's.
    """
def check_pipeline_plan(plan: PipelinePlan, send_ids: typing.Annotated[numpy.typing.ArrayLike, numpy.uint64], send_addresses: typing.Annotated[numpy.typing.ArrayLike, numpy.uint64], send_nbytes: typing.Annotated[numpy.typing.ArrayLike, numpy.uint64], recv_ids: typing.Annotated[numpy.typing.ArrayLike, numpy.uint64], recv_addresses: typing.Annotated[numpy.typing.ArrayLike, numpy.uint64], recv_nbytes: typing.Annotated[numpy.typing.ArrayLike, numpy.uint64], my_pe: typing.SupportsInt | typing.SupportsIndex, world_size: typing.SupportsInt | typing.SupportsIndex, slot_nbytes: typing.SupportsInt | typing.SupportsIndex) -> None:
    """
    The checks PipelineExecutor.check makes, without an executor (the CUDA executor's; ValueError naming the field).
    """
def check_timeout(timeout: float | None, operation: str) -> float | None:
    """
    The package's timeout rules (see tensorxfer.errors): None (or +inf) -> None, meaning no deadline; a number of seconds >= 0 -> float seconds (0: try once). TypeError / ValueError naming `operation`'s timeout otherwise.
    """
def choose_all_reduce_algorithm(nbytes: typing.SupportsInt | typing.SupportsIndex, world_size: typing.SupportsInt | typing.SupportsIndex) -> str:
    ...
def communicator_required_nbytes(max_bytes: typing.SupportsInt | typing.SupportsIndex, buffer_bytes: typing.SupportsInt | typing.SupportsIndex, world_size: typing.SupportsInt | typing.SupportsIndex) -> int:
    ...
def copy_spans(spans: typing.Annotated[numpy.typing.ArrayLike, numpy.uint64], engine: CopyEngine = None) -> None:
    """
    Copies spans[i, 2] bytes from address spans[i, 0] to address spans[i, 1] for every row of the (n, 3) uint64 array (GIL released; work split across `engine`'s threads when large). The caller keeps every span's memory alive. Private to the copy services and the pipeline executor.
    """
def cpu_features() -> dict:
    """
    What the CPU offers the paths that branch on it, as read once by this process: vendor, family, model, avx2 and avx512 (what the CPU has), vector_set (the widest set the kernels use), last_level_cache_bytes, usable_cpus, which of them a TENSORXFER_CPU_* variable forced, and override_error (an invalid variable, else '').
    """
def cuda_concurrent_managed_access(device: typing.SupportsInt | typing.SupportsIndex) -> bool:
    ...
def cuda_copy_spans(table: typing.SupportsInt | typing.SupportsIndex, count: typing.SupportsInt | typing.SupportsIndex, cuda_device: typing.SupportsInt | typing.SupportsIndex, stream: typing.SupportsInt | typing.SupportsIndex) -> None:
    """
    Queues the copy of `count` spans, rows (source, destination, nbytes) of uint64 at device address `table`, on `stream` (one block per span).
    """
def cuda_host_register(pointer: typing.SupportsInt | typing.SupportsIndex, nbytes: typing.SupportsInt | typing.SupportsIndex, device: typing.SupportsInt | typing.SupportsIndex) -> bool:
    """
    Pins host memory in place for GPU `device`: True when registered (undo with cuda_host_unregister), False when the whole range was already pinned. Raises with the CUDA error cleared.
    """
def cuda_host_unregister(pointer: typing.SupportsInt | typing.SupportsIndex, device: typing.SupportsInt | typing.SupportsIndex) -> None:
    """
    cudaHostUnregister with GPU `device` current (GIL released).
    """
def cuda_is_managed_pointer(pointer: typing.SupportsInt | typing.SupportsIndex) -> bool:
    ...
def cuda_put(destination: typing.SupportsInt | typing.SupportsIndex, source: typing.SupportsInt | typing.SupportsIndex, nbytes: typing.SupportsInt | typing.SupportsIndex, cuda_device: typing.SupportsInt | typing.SupportsIndex, stream: typing.SupportsInt | typing.SupportsIndex) -> None:
    """
    Queues cudaMemcpyAsync(destination, source, nbytes, device to device) on `stream`.
    """
def cuda_runtime_calls() -> int:
    """
    CUDA runtime calls tensorxfer made in this process so far (inherited across fork).
    """
def cuda_status() -> dict:
    ...
def current_numa_node() -> int:
    ...
def current_process_identity() -> tuple[int, int]:
    """
    (pid, start_ticks) of this process: an identity a reused pid does not share.
    """
def describe_spans(objects: list) -> numpy.typing.NDArray[numpy.uint64]:
    """
    (n, 3) uint64 array: (address, nbytes, flags) of each buffer-protocol object or torch tensor; flags: 1 C-contiguous, 2 host memory, 4 read-only, 8 neither kind (address and size 0). Private to the copy services.
    """
def describe_torch_tensors(tensors: list) -> numpy.typing.NDArray[numpy.uint64]:
    """
    (n, 3) uint64 array of (data_ptr(), nbytes, flags: 1 contiguous, 2 on the host) of each torch tensor in the list (the copy services' _tensors.describe_many; any object with those attributes works).
    """
def find_task_pairs(sends: typing.Annotated[numpy.typing.ArrayLike, numpy.int64], receives: typing.Annotated[numpy.typing.ArrayLike, numpy.int64]) -> tuple[str, int, int, int, numpy.typing.NDArray[numpy.int64]]:
    """
    Pairs (task_id, nbytes, src_rank, dest_rank) rows by task_id: (problem, send_index, receive_index, other_index, pairs (n, 2) of (send row, receive row) in task_id order); problem is '' when they pair up, else the first of duplicate_send, duplicate_receive, missing_receive, missing_send, ranks_differ, sizes_differ (resharding/task_matcher.h).
    """
def half_kernel_sets() -> list[str]:
    """
    Names of the half-precision kernel sets this CPU runs, narrowest first.
    """
def huge_page_bytes(addresses: typing.Annotated[numpy.typing.ArrayLike, numpy.uint64], nbytes: typing.Annotated[numpy.typing.ArrayLike, numpy.uint64]) -> numpy.typing.NDArray[numpy.int64]:
    """
    For each range [addresses[i], addresses[i] + nbytes[i]) of this process: the bytes huge pages back, -1 where the kernel cannot say (PAGEMAP_SCAN, Linux 6.7). Reads no memory.
    """
def huge_page_size() -> int:
    """
    The default huge page size in bytes.
    """
def make_view(obj: typing.Any, argument: str) -> TensorView:
    """
    View a buffer-protocol or DLPack object; `argument` names it in errors.
    """
def managed_advise_accessed_by(view: TensorView, argument: str, device: typing.SupportsInt | typing.SupportsIndex) -> None:
    ...
def managed_advise_preferred_location(view: TensorView, argument: str, device: typing.SupportsInt | typing.SupportsIndex) -> None:
    ...
def managed_prefetch(view: TensorView, argument: str, device: typing.SupportsInt | typing.SupportsIndex, stream: typing.SupportsInt | typing.SupportsIndex = 0) -> None:
    ...
def message_sizes(item_nbytes: typing.Annotated[numpy.typing.ArrayLike, numpy.uint64], bucket_nbytes: typing.SupportsInt | typing.SupportsIndex) -> numpy.typing.NDArray[numpy.uint64]:
    """
    The message sizes of a stream of items of these sizes (resharding/stream_messages.h): small items share buckets of at most bucket_nbytes, an item of half a bucket or more starts its own messages.
    """
def numa_nodes_of(view: TensorView, argument: str) -> list[int]:
    ...
def numa_nodes_with_memory() -> list[int]:
    ...
def numa_online_nodes(root: str = '/sys/devices/system/node') -> list:
    """
    The online NUMA nodes in sysfs: [{'id', 'cpus', 'memory_bytes'}] (empty without the directory).
    """
def numa_policy_of(view: TensorView, argument: str) -> dict:
    ...
def numa_supported() -> bool:
    ...
def numa_unsupported_reason() -> str:
    ...
def pack_rows(dst: typing.Any, layout: PackLayout, sources: list, indices: typing.Any, engine: CopyEngine = None) -> None:
    """
    Gathers sources[f][indices] into dst at each field's offset (GIL released). sources: [(field name, tensor)]. Use tensorxfer.ipc.pack_rows instead.
    """
def pack_spans(dst: typing.Any, addresses: typing.Annotated[numpy.typing.ArrayLike, numpy.uint64], nbytes: typing.Annotated[numpy.typing.ArrayLike, numpy.uint64], engine: CopyEngine = None) -> None:
    """
    Copies the host spans (addresses[i], nbytes[i]) back to back into dst (GIL released). The caller keeps every span's memory alive. Private to tensorxfer.resharding.copy_services.
    """
def page_size() -> int:
    """
    The system page size in bytes.
    """
def pipeline_region_nbytes(slot_nbytes: typing.SupportsInt | typing.SupportsIndex) -> int:
    ...
def plan_pipeline(tasks: typing.Annotated[numpy.typing.ArrayLike, numpy.int64], world_size: typing.SupportsInt | typing.SupportsIndex, slot_nbytes: typing.SupportsInt | typing.SupportsIndex, max_tasks_per_batch: typing.SupportsInt | typing.SupportsIndex, my_pe: typing.SupportsInt | typing.SupportsIndex) -> PipelinePlan:
    """
    Rank my_pe's plan from already matched (task_id, nbytes, src_rank, dest_rank) rows, task ids strictly increasing (they are not matched again; every rank gets the same schedule).
    """
def populate_host_pages(view: TensorView, argument: str, method: str = 'auto') -> dict:
    """
    Prefault every page the view covers (MADV_POPULATE_*, else touching) and hint MADV_WILLNEED.
    """
def prefer_local_numa_node(view: TensorView, argument: str) -> int:
    ...
def probe_futex_across_processes() -> tuple[bool, str]:
    """
    (works, detail): whether a futex wake reaches a sleeper in another process (forks a child).
    """
def probe_numa_system_calls() -> list:
    """
    Tries get_mempolicy, set_mempolicy, mbind and move_pages now: [{'name', 'permitted', 'errno', 'detail'}].
    """
def probe_process_memory(pid: typing.SupportsInt | typing.SupportsIndex, address: typing.SupportsInt | typing.SupportsIndex, expected: bytes) -> bool:
    """
    True if the bytes at `address` in `pid` can be read and equal `expected` (at most 4096 bytes).
    """
def process_is_alive(pid: typing.SupportsInt | typing.SupportsIndex, start_ticks: typing.SupportsInt | typing.SupportsIndex) -> bool:
    """
    True while the process of that identity exists, has not exited and is the same process (pids are only meaningful within one pid namespace).
    """
def read_process_spans(pid: typing.SupportsInt | typing.SupportsIndex, spans: typing.Annotated[numpy.typing.ArrayLike, numpy.uint64], engine: CopyEngine) -> None:
    """
    For each row (remote address, local address, nbytes) of `spans`: copies nbytes at the remote address in process `pid` to the local address (process_vm_readv, many rows per call, the calls spread over the engine's threads).
    """
def reduce_elements(dtype: str, op: str, sources: collections.abc.Sequence[typing.Any], out: typing.Any, divisor: typing.SupportsInt | typing.SupportsIndex, kernels: str = 'auto') -> None:
    """
    out = op(sources...) elementwise, in source order, as the collectives reduce (dtype 'bfloat16' or 'float16' reads uint16 buffers as that type; otherwise out's dtype).
    """
def require_contiguous_host(view: TensorView, argument: str) -> None:
    ...
def resident_page_count(view: TensorView, argument: str) -> int:
    """
    Pages of the view resident in RAM now (mincore).
    """
def sweep_stale_segments() -> int:
    """
    Remove /dev/shm/tensorxfer-* segments whose creator has exited; returns how many.
    """
def unpack_spans(src: typing.Any, addresses: typing.Annotated[numpy.typing.ArrayLike, numpy.uint64], nbytes: typing.Annotated[numpy.typing.ArrayLike, numpy.uint64], engine: CopyEngine = None) -> None:
    """
    Copies src's bytes, back to back, into the host spans (addresses[i], nbytes[i]) (GIL released); the inverse of pack_spans. Private to the copy services.
    """
__version__: str
build_info: dict
cuda_copy_compiled: bool = True
cuda_span_piece_bytes: int = 65536
uvm_free_symbol: str = 'tensorxfer_uvm_free'
uvm_last_error_symbol: str = 'tensorxfer_uvm_last_error'
uvm_malloc_symbol: str = 'tensorxfer_uvm_malloc'
