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

import contextlib
import ctypes
import enum
import operator
import os
import sys
import threading
from typing import Any, Iterator, List, Optional, Tuple

from tensorxfer import _core
from tensorxfer._tensor import as_view
from tensorxfer.errors import UnsupportedError
from tensorxfer.inference._host_pool import HostMemPool, create_host_mempool


class CompilationState(enum.Enum):
    """Enum to distinguish between unified memory (UVM) compilation states."""

    UNATTEMPTED = enum.auto()  # compile_allocator() has not run yet
    FAILURE = enum.auto()  # the allocator cannot be used here; see _compilation_error
    SUCCESS = enum.auto()  # _alloc is a CUDAPluggableAllocator over the extension's symbols


class UnifiedMemoryUnsupportedError(UnsupportedError):
    """Unified memory is not supported on this system."""


class UnifiedMemoryCompileTimeoutError(UnifiedMemoryUnsupportedError):
    """Unified memory compilation timed out."""


# Module state, named as in the reference. Written only under _compile_lock.
_compilation_state: CompilationState = CompilationState.UNATTEMPTED
_alloc: Any = None  # torch's allocator object built from the extension's symbols
_mod: Any = None  # the module holding the allocator: tensorxfer._core
_so_path: Optional[str] = None  # the extension library exporting the symbols
_ctypes_lib: Optional[ctypes.CDLL] = None
_ctypes_lock = threading.Lock()
_compilation_error: Optional[str] = None
_compile_lock = threading.Lock()

_COMPILE_TIMEOUT_S = 60.0

_MALLOC_SYMBOL: str = _core.uvm_malloc_symbol
_FREE_SYMBOL: str = _core.uvm_free_symbol

# PyThreadState_SetAsyncExc with an exception type, and with NULL (to cancel a pending one).
_set_async_exc = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_ulong, ctypes.py_object)(
    ("PyThreadState_SetAsyncExc", ctypes.pythonapi)
)
_clear_async_exc = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p)(
    ("PyThreadState_SetAsyncExc", ctypes.pythonapi)
)


# ---- compilation (availability of the compiled-in allocator) -----------------------
@contextlib.contextmanager
def _compile_timeout(timeout_s: float) -> Iterator[None]:
    """Context manager to timeout compilation.

    Raises :class:`UnifiedMemoryCompileTimeoutError` in the thread running the
    block once ``timeout_s`` seconds have passed. Works on any thread (a timer
    thread interrupts the block; no ``SIGALRM``). Python code is interrupted at
    once; a blocking native call is interrupted when it returns.

    Args:
        timeout_s: timeout in seconds (> 0).
    """
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)):
        raise TypeError(f"timeout_s must be a number of seconds, got {type(timeout_s).__name__}")
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
    target = threading.get_ident()
    guard = threading.Lock()
    state = {"done": False, "fired": False}

    def fire() -> None:
        with guard:
            if state["done"]:
                return
            state["fired"] = True
            _set_async_exc(target, UnifiedMemoryCompileTimeoutError)

    timer = threading.Timer(timeout_s, fire)
    timer.daemon = True
    timer.start()
    error: Optional[BaseException] = None
    try:
        yield
    except UnifiedMemoryCompileTimeoutError as exc:
        error = exc
    finally:
        timer.cancel()
        fired = _finish_timeout(target, guard, state)
        if not fired and error is not None:
            raise error
    if fired:
        message = f"unified memory allocator setup timed out after {timeout_s} s"
        raise UnifiedMemoryCompileTimeoutError(message) from None


def _finish_timeout(target: int, guard: threading.Lock, state: dict) -> bool:
    """Disarms a _compile_timeout; returns whether it fired (cancelling a still-pending exception)."""
    while True:
        try:
            with guard:
                state["done"] = True
                fired = state["fired"]
            if fired:
                _clear_async_exc(target, None)
            return fired
        except UnifiedMemoryCompileTimeoutError:
            continue  # the timer's exception landed here; `fired` accounts for it


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


def compile_allocator() -> CompilationState:
    """Attempt to compile UVM allocator.

    The allocator is compiled into the extension, so this checks that it can be
    used here (exported symbols, a CUDA device, torch with CUDA) and builds the
    torch allocator object. Runs once per process, thread-safe; records the
    outcome in ``_compilation_state`` and the reason of a failure in
    ``_compilation_error``. Never raises for an unsupported system.

    Returns:
        The recorded :class:`CompilationState`.
    """
    global _compilation_state, _alloc, _mod, _so_path, _compilation_error
    if _compilation_state is not CompilationState.UNATTEMPTED:
        return _compilation_state
    with _compile_lock:
        if _compilation_state is not CompilationState.UNATTEMPTED:
            return _compilation_state
        try:
            with _compile_timeout(_COMPILE_TIMEOUT_S):
                allocator, module, so_path = _load_allocator()
        except (UnsupportedError, ImportError, OSError, RuntimeError, AttributeError) as exc:
            _compilation_error = str(exc) or type(exc).__name__
            _compilation_state = CompilationState.FAILURE
        else:
            _alloc, _mod, _so_path = allocator, module, so_path
            _compilation_error = None
            _compilation_state = CompilationState.SUCCESS
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
        raise UnifiedMemoryUnsupportedError(f"unified memory is unavailable: {_compilation_error}")
    try:
        from torch.cuda.memory import MemPool
    except ImportError:  # torch < 2.8
        from torch.cuda import MemPool  # type: ignore[attr-defined,no-redef]
    return MemPool(allocator=_alloc)


# ---- argument checks ---------------------------------------------------------------
def _device_id(device: Any, *, gpu_only: bool = False) -> int:
    if isinstance(device, bool):
        raise TypeError("device must be an int device id, got bool")
    try:
        value = operator.index(device)
    except TypeError:
        raise TypeError(f"device must be an int device id (-1 for the CPU), got {type(device).__name__}") from None
    if gpu_only and value < 0:
        raise ValueError(
            f"device must be a GPU id (>= 0), got {value}: the CPU always has access to managed memory"
        )
    if value < -1:
        raise ValueError(f"device must be -1 (the CPU) or a GPU id >= 0, got {value}")
    return value


def _view_of(tensor: Any, name: str) -> Any:
    """A contiguous view of a host or CUDA tensor; raises TypeError/ValueError naming ``name``."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(tensor, torch.Tensor):
        if tensor.layout != torch.strided:
            raise ValueError(f"{name} must be a dense (strided) tensor, got layout {tensor.layout}")
        if tensor.device.type not in ("cpu", "cuda"):
            raise ValueError(f"{name} must be a cpu or cuda tensor, got device {tensor.device}")
    if tensor is None:
        raise TypeError(f"{name} must be a tensor (torch.Tensor, numpy array, DLPack or buffer object), got None")
    view = as_view(tensor, name)
    if not view.is_host and not view.device.startswith("cuda"):
        raise ValueError(f"{name} must be in host or CUDA memory, got {view.describe()}")
    return view


def _require_gpu(device: int, operation: str) -> None:
    status = _core.cuda_status()
    if status["device_count"] == 0:
        raise UnifiedMemoryUnsupportedError(
            f"{operation}: GPU device {device} was requested but no CUDA device is usable: {status['reason']}"
        )


@contextlib.contextmanager
def _unified_errors() -> Iterator[None]:
    try:
        yield
    except UnifiedMemoryUnsupportedError:
        raise
    except UnsupportedError as exc:
        raise UnifiedMemoryUnsupportedError(str(exc)) from exc


def _stream_handle(stream: Any) -> int:
    if stream is None:
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_available():
            return int(torch.cuda.current_stream().cuda_stream)
        return 0
    if hasattr(stream, "cuda_stream"):
        return int(stream.cuda_stream)
    if isinstance(stream, int) and not isinstance(stream, bool):
        return stream
    raise TypeError(f"stream must be None, a torch.cuda.Stream or a cudaStream_t int, got {type(stream).__name__}")


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
    handle = _stream_handle(stream)
    if view.nbytes == 0:
        return
    with _unified_errors():
        if view.is_host and target == -1:
            _core.populate_host_pages(view, "tensor")
            return
        if target >= 0:
            _require_gpu(target, "prefetch_managed_tensor")
        _core.managed_prefetch(view, "tensor", target, handle)


def advise_managed_tensor_preferred_location(tensor: Any, *, device: int) -> None:
    """Set the preferred physical location hint for a managed tensor.

    CUDA managed tensors get ``cudaMemAdviseSetPreferredLocation`` (a hint;
    no immediate migration). Host tensors with ``-1`` get a NUMA preference
    (``MPOL_PREFERRED``) for the calling thread's node.

    Args:
        tensor: CUDA tensor from the UVM mempool, or a contiguous host tensor/array.
        device: preferred device ID; -1 (cudaCpuDeviceId) is the CPU.
    """
    view = _view_of(tensor, "tensor")
    target = _device_id(device)
    if view.nbytes == 0:
        return
    with _unified_errors():
        if view.is_host and target == -1:
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


# ---- NUMA placement of host tensors -----------------------------------------------------
def _host_view(tensor: Any, name: str) -> Any:
    view = _view_of(tensor, name)
    if not view.is_host:
        raise ValueError(f"{name} must be in host memory (device cpu), got {view.describe()}")
    return view


def numa_nodes_with_memory() -> List[int]:
    """The NUMA nodes this process can allocate memory on (raises UnifiedMemoryUnsupportedError without NUMA)."""
    with _unified_errors():
        return list(_core.numa_nodes_with_memory())


def bind_to_numa_node(tensor: Any, node: int) -> None:
    """Bind the pages of a host tensor to NUMA ``node``, moving the resident ones there.

    Pages not yet touched are allocated on ``node`` when first written. The
    policy covers whole pages, including bytes that share them with the tensor.

    Raises:
        ValueError: ``node`` is not a node with memory (the message lists them),
            or the tensor is not contiguous host memory.
        UnifiedMemoryUnsupportedError: NUMA is unavailable in this build/kernel.
    """
    view = _host_view(tensor, "tensor")
    if isinstance(node, bool):
        raise TypeError("node must be an int NUMA node id, got bool")
    try:
        node_id = operator.index(node)
    except TypeError:
        raise TypeError(f"node must be an int NUMA node id, got {type(node).__name__}") from None
    with _unified_errors():
        _core.bind_to_numa_node(view, "tensor", node_id)


def numa_nodes_of(tensor: Any) -> List[int]:
    """For each page a host tensor covers, the NUMA node holding it.

    Negative entries are ``-errno``: ``-errno.ENOENT`` for a page not resident
    yet, ``-errno.EFAULT`` for an unmapped one. An empty tensor gives ``[]``.
    """
    view = _host_view(tensor, "tensor")
    with _unified_errors():
        return list(_core.numa_nodes_of(view, "tensor"))


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
