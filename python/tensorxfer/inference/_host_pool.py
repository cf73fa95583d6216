"""Host memory pools: page-aligned numpy arrays and torch tensors.

Each allocation is its own anonymous mapping (``mmap``), optionally on huge
pages and optionally page-locked, made by the native ``_core.HostPool``.
Arrays keep their allocation alive; when an array is gone its block returns to
the pool's cache for reuse, and when the pool is closed (or dropped) and all its
arrays are gone, every byte is unmapped.
"""

from __future__ import annotations

import operator
import sys
import threading
import weakref
from typing import Any, Dict, Optional, Sequence, Tuple, Union

import numpy as np

from tensorxfer import _core

Shape = Union[int, Sequence[int]]

_DEFAULT_MAX_CACHED_BYTES = 256 << 20


def _torch_dtype_or_none(dtype: Any) -> Any:
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(dtype, torch.dtype):
        return dtype
    return None


def _normalize_shape(shape: Shape) -> Tuple[int, ...]:
    given: Any = shape  # an int-like or a sequence of them; operator.index decides
    try:
        dims: Tuple[int, ...] = (operator.index(given),)
    except TypeError:
        try:
            dims = tuple(operator.index(d) for d in given)
        except TypeError:
            raise TypeError(f"shape must be an int or a sequence of ints, got {shape!r}") from None
    if any(d < 0 for d in dims):
        raise ValueError(f"shape must not have negative dimensions, got {dims}")
    return dims


class HostMemPool:
    """A pool of page-aligned host allocations handing out numpy arrays or torch tensors.

    Create it with :func:`create_host_mempool`. ``empty``/``zeros`` return a
    torch tensor when ``dtype`` is a ``torch.dtype`` and a numpy array
    otherwise. Thread-safe. Use as a context manager or call :meth:`close`.
    """

    def __init__(
        self,
        *,
        huge_pages: bool = False,
        lock_pages: bool = False,
        numa_node: Optional[int] = None,
        max_cached_bytes: int = _DEFAULT_MAX_CACHED_BYTES,
    ) -> None:
        """See :func:`create_host_mempool` for the arguments."""
        for name, flag in (("huge_pages", huge_pages), ("lock_pages", lock_pages)):
            if not isinstance(flag, bool):
                raise TypeError(f"{name} must be a bool, got {type(flag).__name__}")
        node = -1 if numa_node is None else _index(numa_node, "numa_node")
        if numa_node is not None and node < 0:
            raise ValueError(f"numa_node must be None (no binding) or a node id >= 0, got {node}")
        cached = _index(max_cached_bytes, "max_cached_bytes")
        if cached < 0:
            raise ValueError(f"max_cached_bytes must be >= 0, got {cached}")
        self._native = _core.HostPool(
            huge_pages=huge_pages, lock_pages=lock_pages, numa_node=node, max_cached_bytes=cached
        )
        self._blocks_lock = threading.Lock()
        self._blocks: Dict[int, "weakref.ref[Any]"] = {}  # data_ptr -> live block

    # ---- allocation ---------------------------------------------------------------
    def allocate_block(self, nbytes: int) -> Any:
        """A raw page-aligned block of ``nbytes`` (a writable uint8 buffer, ``_core.HostBlock``).

        Its ``huge_pages``, ``locked``, ``lock_error`` and ``reused`` attributes
        say how it was mapped. Raises :class:`tensorxfer.errors.ClosedError` once the pool is closed.
        """
        size = _index(nbytes, "nbytes")
        if size < 0:
            raise ValueError(f"nbytes must be >= 0, got {size}")
        block = self._native.allocate(size)
        address = block.data_ptr
        pool_ref = weakref.ref(self)  # the callback must not keep the pool alive

        def forget(ref: Any, address: int = address) -> None:
            pool = pool_ref()
            if pool is not None:
                pool._forget(address, ref)

        with self._blocks_lock:
            self._blocks[address] = weakref.ref(block, forget)
        return block

    def empty(self, shape: Shape, dtype: Any = np.float32) -> Any:
        """An uninitialised array of ``shape`` and ``dtype`` in pool memory.

        Fresh blocks read as zero but reused blocks hold old data. A zero-element
        request returns an ordinary empty array (there is no memory to place).
        """
        dims = _normalize_shape(shape)
        torch_dtype = _torch_dtype_or_none(dtype)
        count = 1
        for d in dims:
            count *= d
        if torch_dtype is not None:
            import torch

            nbytes = count * torch_dtype.itemsize
            if nbytes == 0:
                return torch.empty(dims, dtype=torch_dtype)
            raw = torch.frombuffer(self.allocate_block(nbytes), dtype=torch.uint8, count=nbytes)
            return raw.view(torch_dtype).view(dims)
        np_dtype = np.dtype(dtype)
        nbytes = count * np_dtype.itemsize
        if nbytes == 0:
            return np.empty(dims, dtype=np_dtype)
        return np.frombuffer(self.allocate_block(nbytes), dtype=np_dtype, count=count).reshape(dims)

    def zeros(self, shape: Shape, dtype: Any = np.float32) -> Any:
        """Like :meth:`empty`, filled with zeros."""
        array = self.empty(shape, dtype)
        if _torch_dtype_or_none(dtype) is not None:
            array.zero_()
        else:
            array.fill(0)
        return array

    def copy_of(self, tensor: Any) -> Any:
        """A copy of a host numpy array or torch tensor in pool memory (same kind, dtype and shape)."""
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(tensor, torch.Tensor):
            if tensor.device.type != "cpu":
                raise ValueError(f"tensor must be on the cpu, got device {tensor.device}")
            copy = self.empty(tuple(tensor.shape), tensor.dtype)
            with torch.no_grad():
                copy.copy_(tensor)
            return copy
        if isinstance(tensor, np.ndarray):
            copy = self.empty(tensor.shape, tensor.dtype)
            np.copyto(copy, tensor)
            return copy
        raise TypeError(f"tensor must be a numpy array or a torch tensor, got {type(tensor).__name__}")

    def adopt_module(self, module: Any, *, include_buffers: bool = True) -> Any:
        """Move a torch module's parameters (and buffers) into pool memory, in place.

        Parameter objects are kept (``param.data`` is replaced), so optimizers
        and tied weights stay valid. Returns ``module``.
        """
        if not hasattr(module, "named_modules"):
            raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
        import torch

        moved: Dict[int, Any] = {}
        for submodule in module.modules():
            for param in submodule._parameters.values():
                if param is not None and id(param) not in moved:
                    moved[id(param)] = param
                    param.data = self.copy_of(param.data)
            if not include_buffers:
                continue
            for name, buffer in list(submodule._buffers.items()):
                if buffer is None or not isinstance(buffer, torch.Tensor):
                    continue
                if id(buffer) not in moved:
                    moved[id(buffer)] = self.copy_of(buffer)
                submodule._buffers[name] = moved[id(buffer)]
        return module

    # ---- introspection ------------------------------------------------------------
    def block_of(self, tensor: Any) -> Optional[Any]:
        """The live block holding ``tensor``'s first byte, or None if it is not pool memory."""
        from tensorxfer._tensor import as_view

        address = as_view(tensor, "tensor", contiguous=False).data_ptr
        with self._blocks_lock:
            refs = list(self._blocks.values())
        for ref in refs:
            block = ref()
            if block is not None and block.data_ptr <= address < block.data_ptr + max(block.nbytes, 1):
                return block
        return None

    def stats(self) -> Dict[str, Any]:
        """Counters: live/cached blocks and bytes, mapped/reused blocks, huge page and mlock outcomes."""
        return self._native.stats()

    @property
    def huge_pages(self) -> bool:
        """Whether huge pages were requested."""
        return self._native.huge_pages

    @property
    def lock_pages(self) -> bool:
        """Whether page locking (mlock) was requested."""
        return self._native.lock_pages

    @property
    def numa_node(self) -> Optional[int]:
        """The NUMA node blocks are bound to, or None."""
        node = self._native.numa_node
        return None if node < 0 else node

    @property
    def closed(self) -> bool:
        """True after :meth:`close`."""
        return self._native.closed

    # ---- lifetime -----------------------------------------------------------------
    def release_cached(self) -> None:
        """Unmap the cached (released, unused) blocks now."""
        self._native.release_cached()

    def close(self) -> None:
        """Stop handing out and caching blocks; live arrays stay valid. Idempotent."""
        self._native.close()

    def __enter__(self) -> "HostMemPool":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        stats = self.stats()
        return (
            f"HostMemPool(huge_pages={self.huge_pages}, lock_pages={self.lock_pages}, "
            f"numa_node={self.numa_node}, live_blocks={stats['live_blocks']}, "
            f"cached_blocks={stats['cached_blocks']}, closed={stats['closed']})"
        )

    def _forget(self, address: int, ref: Any) -> None:
        with self._blocks_lock:
            if self._blocks.get(address) is ref:
                del self._blocks[address]


def _index(value: Any, name: str) -> int:
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got bool")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {type(value).__name__}") from None


def create_host_mempool(
    *,
    huge_pages: bool = False,
    lock_pages: bool = False,
    numa_node: Optional[int] = None,
    max_cached_bytes: int = _DEFAULT_MAX_CACHED_BYTES,
) -> HostMemPool:
    """Create a pool of page-aligned host memory that hands out numpy arrays or torch tensors.

    Args:
        huge_pages: back allocations of at least one huge page with huge pages:
            ``MAP_HUGETLB`` when pages are reserved, else transparent huge pages
            (``MADV_HUGEPAGE``). Each block's ``huge_pages`` says which was used
            ("hugetlb", "transparent" or "none") and ``huge_pages_note`` why.
        lock_pages: ``mlock`` every allocation. Failure (e.g. past
            ``RLIMIT_MEMLOCK``) is reported (``block.locked``, ``lock_error``,
            ``stats()["lock_failures"]``), not raised.
        numa_node: bind every allocation to this NUMA node (None: no binding).
            A node without memory raises ``ValueError`` listing the valid ones.
        max_cached_bytes: released blocks kept for reuse, at most this many bytes.

    Returns:
        A :class:`HostMemPool`.
    """
    return HostMemPool(
        huge_pages=huge_pages,
        lock_pages=lock_pages,
        numa_node=numa_node,
        max_cached_bytes=max_cached_bytes,
    )


__all__ = ["HostMemPool", "create_host_mempool"]

