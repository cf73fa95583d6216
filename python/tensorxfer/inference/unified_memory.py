"""Unified memory: managed pools, prefetch and placement advice, on the host and on CUDA.

The documented ``core.inference.unified_memory`` API, backed by the native core
instead of compiling an allocator at run time:

* The CUDA managed-memory allocator (``cudaMallocManaged``) is compiled into
  the extension ``tensorxfer._core`` and exported as the C symbols
  ``tensorxfer_uvm_malloc`` / ``tensorxfer_uvm_free``, which
  ``torch.cuda.memory.CUDAPluggableAllocator`` loads. :func:`compile_allocator`
  checks that this can work here and records :class:`CompilationState`.
* On host tensors (numpy arrays, CPU torch tensors, :func:`create_host_mempool`
  allocations) the same calls do what the host can: prefetching to ``device=-1``
  populates the pages and hints ``MADV_WILLNEED``; preferring ``-1`` sets a NUMA
  preference for the caller's node. :func:`bind_to_numa_node` and
  :func:`numa_nodes_of` place and report pages explicitly.

``device=-1`` means the CPU (``cudaCpuDeviceId``). A GPU id on a machine
without a usable GPU raises :class:`UnifiedMemoryUnsupportedError` saying why.
Empty tensors are a no-op; tensors of the wrong kind raise ``TypeError`` /
``ValueError`` naming the argument.
"""

from __future__ import annotations

import ctypes
import enum
import os
import threading
from typing import Any, List, Optional, Tuple

from tensorxfer import _core
from tensorxfer.errors import UnsupportedError
from tensorxfer.inference._arguments import device_id as _device_id
from tensorxfer.inference._arguments import require_gpu as _require_gpu
from tensorxfer.inference._arguments import stream_handle as _stream_handle
from tensorxfer.inference._arguments import view_of as _view_of
from tensorxfer.inference._errors import UnifiedMemoryCompileTimeoutError, UnifiedMemoryUnsupportedError
from tensorxfer.inference._errors import unified_errors as _unified_errors
from tensorxfer.inference._host_pool import HostMemPool, create_host_mempool
from tensorxfer.inference._numa import bind_to_numa_node, numa_nodes_of, numa_nodes_with_memory
from tensorxfer.inference._timeout import compile_timeout as _compile_timeout


class CompilationState(enum.Enum):
    """Enum to distinguish between unified memory (UVM) compilation states."""

    UNATTEMPTED = enum.auto()  # compile_allocator() has not run yet
    FAILURE = enum.auto()  # the allocator cannot be used here; see _compilation_error
    SUCCESS = enum.auto()  # _alloc is a CUDAPluggableAllocator over the extension's symbols


# Module state, named as in the reference. Written only under _compile_lock.
_compilation_state: CompilationState = CompilationState.UNATTEMPTED
_alloc: Any = None  # torch's allocator object built from the extension's symbols
_mod: Any = None  # the module holding the allocator: tensorxfer._core
_so_path: Optional[str] = None  # the extension library exporting the symbols
_ctypes_lib: Optional[ctypes.CDLL] = None
_ctypes_lock = threading.Lock()
_compilation_error: Optional[str] = None
_compile_lock = threading.Lock()
# True while FAILURE stands for a setup that timed out and still runs in _background_compile,
# which records its real outcome (SUCCESS or FAILURE) when it finishes.
_compilation_timed_out = False
_background_compile: Optional[threading.Thread] = None

_COMPILE_TIMEOUT_S = 60.0

_MALLOC_SYMBOL: str = _core.uvm_malloc_symbol
_FREE_SYMBOL: str = _core.uvm_free_symbol


# ---- compilation (availability of the compiled-in allocator) -----------------------
def _get_ctypes_lib() -> ctypes.CDLL:
    """Return a ctypes handle to the compiled UVM extension (.so)."""
    global _ctypes_lib
    with _ctypes_lock:
        if _ctypes_lib is None:
            _ctypes_lib = ctypes.CDLL(_core.__file__)
        return _ctypes_lib


def _load_allocator() -> Tuple[Any, Any, str]:
    """Checks every requirement of the managed allocator; returns (allocator, module, so_path)."""
    lib = _get_ctypes_lib()
    for symbol in (_MALLOC_SYMBOL, _FREE_SYMBOL):
        if not hasattr(lib, symbol):
            raise UnifiedMemoryUnsupportedError(f"{_core.__file__} does not export {symbol}")
    status = _core.cuda_status()
    if not status["compiled"] or status["device_count"] == 0:
        raise UnifiedMemoryUnsupportedError(f"no usable CUDA device: {status['reason']}")
    try:
        import torch
        from torch.cuda.memory import CUDAPluggableAllocator
    except ImportError as exc:
        raise UnifiedMemoryUnsupportedError(f"torch with CUDAPluggableAllocator is needed: {exc}") from exc
    if not torch.cuda.is_available():
        raise UnifiedMemoryUnsupportedError(
            f"torch {torch.__version__} sees no CUDA device (a CPU-only build or no driver)"
        )
    allocator = CUDAPluggableAllocator(_core.__file__, _MALLOC_SYMBOL, _FREE_SYMBOL).allocator()
    return allocator, _core, _core.__file__


_SETUP_FAILURES = (UnsupportedError, ImportError, OSError, RuntimeError, AttributeError)


def _record_outcome(loaded: Optional[Tuple[Any, Any, str]], error: Optional[BaseException]) -> None:
    """Records the allocator setup's outcome; the caller holds ``_compile_lock``."""
    global _compilation_state, _alloc, _mod, _so_path, _compilation_error, _compilation_timed_out
    _compilation_timed_out = False
    if error is None and loaded is not None:
        _alloc, _mod, _so_path = loaded
        _compilation_error = None
        _compilation_state = CompilationState.SUCCESS
    else:
        _compilation_error = (str(error) or type(error).__name__) if error is not None else "no allocator"
        _compilation_state = CompilationState.FAILURE


def _record_late_outcome(loaded: Any, error: Optional[BaseException]) -> None:
    """Called in the setup's worker thread when it finishes after compile_allocator gave up on it."""
    with _compile_lock:
        if _compilation_timed_out:  # not reset (by a test) in the meantime
            _record_outcome(loaded, error)


def compile_allocator() -> CompilationState:
    """Attempt to compile UVM allocator.

    The allocator is compiled into the extension, so this checks that it can be
    used here (exported symbols, a CUDA device, torch with CUDA) and builds the
    torch allocator object. Runs once per process, thread-safe; records the
    outcome in ``_compilation_state`` and the reason of a failure in
    ``_compilation_error``. Never raises for an unsupported system.

    The setup runs in a worker thread under ``_compile_timeout``: when it takes
    longer than ``_COMPILE_TIMEOUT_S`` the state becomes FAILURE (and
    :func:`create_unified_mempool` raises
    :class:`UnifiedMemoryCompileTimeoutError`) while the worker, never
    interrupted, finishes on its own and then records its real outcome.

    Returns:
        The recorded :class:`CompilationState`.
    """
    global _compilation_state, _compilation_error, _compilation_timed_out, _background_compile
    if _compilation_state is not CompilationState.UNATTEMPTED:
        return _compilation_state
    with _compile_lock:
        if _compilation_state is not CompilationState.UNATTEMPTED:
            return _compilation_state
        try:
            with _compile_timeout(_COMPILE_TIMEOUT_S) as run:
                try:
                    loaded = run(_load_allocator, on_late=_record_late_outcome)
                finally:
                    worker = run.worker
        except UnifiedMemoryCompileTimeoutError as exc:
            _compilation_error = f"{exc}; the setup continues in the background and records its outcome when done"
            _compilation_state = CompilationState.FAILURE
            _compilation_timed_out = True
            _background_compile = worker
        except _SETUP_FAILURES as exc:
            _record_outcome(None, exc)
        else:
            _record_outcome(loaded, None)
        return _compilation_state


def _expandable_segments_setting() -> Optional[Tuple[str, str]]:
    """(variable, value) of an allocator config enabling expandable segments, else None."""
    for variable in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        value = os.environ.get(variable, "")
        for item in value.split(","):
            key, _, setting = item.partition(":")
            if key.strip() == "expandable_segments" and setting.strip().lower() in ("true", "1"):
                return variable, value
    return None


def create_unified_mempool() -> Any:
    """Create a unified memory mempool using CUDA managed memory.

    Raises:
        UnifiedMemoryUnsupportedError: expandable segments are enabled in the
            torch allocator config, or :func:`compile_allocator` failed (the
            message carries ``_compilation_error``).

    Returns:
        (MemPool) Unified memory mempool.
    """
    expandable = _expandable_segments_setting()
    if expandable is not None:
        variable, value = expandable
        raise UnifiedMemoryUnsupportedError(
            f"create_unified_mempool: {variable}={value!r} enables expandable_segments, which "
            "cannot be combined with a pluggable managed-memory allocator; unset it or set "
            "expandable_segments:False"
        )
    if compile_allocator() is not CompilationState.SUCCESS:
        if _compilation_timed_out:
            raise UnifiedMemoryCompileTimeoutError(f"unified memory is unavailable: {_compilation_error}")
        raise UnifiedMemoryUnsupportedError(f"unified memory is unavailable: {_compilation_error}")
    try:
        from torch.cuda.memory import MemPool
    except ImportError:  # torch < 2.8
        from torch.cuda import MemPool  # type: ignore[attr-defined,no-redef]
    return MemPool(allocator=_alloc)


# ---- tensors -------------------------------------------------------------------------
def prefetch_managed_tensor(tensor: Any, *, device: int, stream: Any = None) -> None:
    """Prefetch a CUDA tensor allocated from the UVM mempool to a specific device.

    CUDA managed tensors are migrated with ``cudaMemPrefetchAsync`` (the
    pointer is unchanged, so recorded CUDA graphs stay valid). Host tensors
    prefetched to ``-1`` have every page they cover populated
    (``MADV_POPULATE_WRITE``, else by touching) and hinted ``MADV_WILLNEED``.

    Args:
        tensor: CUDA tensor from the UVM mempool, or a contiguous host tensor/array.
        device: target device ID; -1 (cudaCpuDeviceId) is the CPU.
        stream: ``torch.cuda.Stream`` (or raw handle) for the asynchronous
            prefetch; defaults to the current stream. Unused on the host.
    """
    view = _view_of(tensor, "tensor")
    target = _device_id(device)
    if stream is not None:
        _stream_handle(stream)  # validates the argument; makes no CUDA call for a given stream
    if view.nbytes == 0:
        return
    with _unified_errors():
        if view.is_host and target == -1 and not view.device.startswith("cuda_managed"):
            # The host path: no CUDA call at all (safe in a forked child of a CUDA process).
            _core.populate_host_pages(view, "tensor")
            return
        if target >= 0:
            _require_gpu(target, "prefetch_managed_tensor")
        _core.managed_prefetch(view, "tensor", target, _stream_handle(stream))


def advise_managed_tensor_preferred_location(tensor: Any, *, device: int) -> None:
    """Set the preferred physical location hint for a managed tensor.

    CUDA managed tensors get ``cudaMemAdviseSetPreferredLocation`` (a hint;
    no immediate migration). Host tensors with ``-1`` get a NUMA preference
    (``MPOL_PREFERRED``, through the ``mbind`` system call) for the calling
    thread's node; where the kernel refuses ``mbind`` (ENOSYS, or EPERM under a
    container's seccomp profile) this raises :class:`UnifiedMemoryUnsupportedError`.

    Args:
        tensor: CUDA tensor from the UVM mempool, or a contiguous host tensor/array.
        device: preferred device ID; -1 (cudaCpuDeviceId) is the CPU.
    """
    view = _view_of(tensor, "tensor")
    target = _device_id(device)
    if view.nbytes == 0:
        return
    with _unified_errors():
        if view.is_host and target == -1 and not view.device.startswith("cuda_managed"):
            _core.prefer_local_numa_node(view, "tensor")
            return
        if target >= 0:
            _require_gpu(target, "advise_managed_tensor_preferred_location")
        _core.managed_advise_preferred_location(view, "tensor", target)


def advise_managed_tensor_accessed_by(tensor: Any, *, device: int) -> None:
    """Hint that a specific device will access the managed tensor.

    Uses ``cudaMemAdviseSetAccessedBy``, which maps the memory in the device's
    page tables to cut first-touch fault latency.

    Args:
        tensor: CUDA tensor from the UVM mempool.
        device: device ID that will access the tensor. Must be a GPU ID
            (``ValueError`` for -1).
    """
    view = _view_of(tensor, "tensor")
    target = _device_id(device, gpu_only=True)
    if view.nbytes == 0:
        return
    with _unified_errors():
        _require_gpu(target, "advise_managed_tensor_accessed_by")
        _core.managed_advise_accessed_by(view, "tensor", target)


# ---- modules -------------------------------------------------------------------------
def _module_tensors(module: Any, include_buffers: bool) -> List[Any]:
    """The module's distinct, non-empty parameters (and buffers) a managed call applies to."""
    if not (hasattr(module, "parameters") and hasattr(module, "buffers")):
        raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
    if not isinstance(include_buffers, bool):
        raise TypeError(f"include_buffers must be a bool, got {type(include_buffers).__name__}")
    tensors = list(module.parameters())
    if include_buffers:
        tensors.extend(module.buffers())
    selected, seen = [], set()
    for tensor in tensors:
        if tensor is None or tensor.numel() == 0:
            continue
        key = (tensor.data_ptr(), tensor.nbytes)
        if key in seen:
            continue
        seen.add(key)
        # CUDA tensors outside managed memory are not UVM-allocated: leave them alone.
        if tensor.device.type == "cuda" and not _core.cuda_is_managed_pointer(tensor.data_ptr()):
            continue
        selected.append(tensor)
    return selected


def prefetch_managed_module_parameters(module: Any, *, device: int, include_buffers: bool = False) -> int:
    """Prefetch all UVM-allocated parameters (and optionally buffers) of a module.

    Host parameters (for example from :meth:`HostMemPool.adopt_module`) are
    populated when ``device`` is -1; CUDA parameters outside managed memory are
    skipped. Tied parameters count once.

    Args:
        module: the torch.nn.Module containing UVM parameters.
        device: target device ID (-1 for CPU).
        include_buffers: whether to also prefetch module buffers.

    Returns:
        The total number of bytes for which prefetch was initiated.
    """
    _device_id(device)
    total = 0
    for tensor in _module_tensors(module, include_buffers):
        prefetch_managed_tensor(tensor, device=device)
        total += tensor.nbytes
    return total


def advise_managed_module_parameters_preferred_location(
    module: Any, *, device: int, include_buffers: bool = False
) -> None:
    """Set the preferred physical location hint for all UVM parameters in a module.

    Args:
        module: the torch.nn.Module containing UVM parameters.
        device: preferred device ID (-1 for CPU).
        include_buffers: whether to also advise on module buffers.
    """
    _device_id(device)
    for tensor in _module_tensors(module, include_buffers):
        advise_managed_tensor_preferred_location(tensor, device=device)


__all__ = [
    "CompilationState",
    "UnifiedMemoryUnsupportedError",
    "UnifiedMemoryCompileTimeoutError",
    "compile_allocator",
    "create_unified_mempool",
    "prefetch_managed_tensor",
    "advise_managed_tensor_preferred_location",
    "advise_managed_tensor_accessed_by",
    "prefetch_managed_module_parameters",
    "advise_managed_module_parameters_preferred_location",
    "HostMemPool",
    "create_host_mempool",
    "bind_to_numa_node",
    "numa_nodes_of",
    "numa_nodes_with_memory",
]
