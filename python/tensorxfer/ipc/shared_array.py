"""SharedArray: a numpy array in POSIX shared memory, attachable from other processes.

::

    store = SharedArray.create((1_000_000, 64), "float32")   # creator
    store.array[:] = ...                                     # numpy view
    other = SharedArray.attach(store.handle)                 # in another process
    other.tensor()                                           # zero-copy torch view

The segment is named ``/tensorxfer-<pid>-<random>``, created exclusively with
mode 0600 and a validated header.  It is removed when the creator closes it or
exits (a survivor that notices a dead creator removes it), so ``/dev/shm`` holds
nothing afterwards.  Views keep the mapping alive, so they never dangle; after
``close()`` they are detached from the other processes' copies.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any, Sequence, Tuple, Union

import numpy as np

from tensorxfer import _core
from tensorxfer._arguments import check_int
from tensorxfer._resource import SharedResource

__all__ = ["SharedArray", "SharedArrayHandle"]

_KIND = "ARRY"


@dataclass(frozen=True)
class SharedArrayHandle:
    """What another process needs to attach: name, shape and dtype. Picklable."""

    name: str
    shape: Tuple[int, ...]
    dtype: str


def normalize_shape(shape: Any) -> Tuple[int, ...]:
    """An int or a sequence of ints >= 0, as a tuple; TypeError/ValueError naming the axis."""
    if isinstance(shape, numbers.Integral) and not isinstance(shape, bool):
        shape = (shape,)
    if isinstance(shape, (str, bytes)) or not hasattr(shape, "__iter__"):
        raise TypeError(f"shape must be an int or a sequence of ints, got {type(shape).__name__} {shape!r}")
    return tuple(check_int(extent, f"shape[{axis}]", 0) for axis, extent in enumerate(shape))


def _normalize_dtype(dtype: Any) -> np.dtype:
    try:
        result = np.dtype(dtype)
    except TypeError as error:
        raise TypeError(f"dtype: {error}") from None
    if result.hasobject:
        raise TypeError(f"dtype must hold plain data, got {result} (Python objects cannot be shared)")
    return result


class SharedArray(SharedResource):
    """A C-contiguous numpy array backed by a shared-memory segment.

    Build it with :meth:`create` or :meth:`attach`; usable as a context manager.
    """

    _kind = "shared array"
    _share_hint = "pass .handle and call SharedArray.attach(handle)"

    def __init__(self, segment: Any, shape: Tuple[int, ...], dtype: np.dtype) -> None:
        self._segment = segment
        self._closed = False
        self._array = segment.array().view(dtype).reshape(shape)

    @classmethod
    def create(cls, shape: Union[int, Sequence[int]], dtype: Any = "float32") -> "SharedArray":
        """A new zero-filled shared array of ``shape`` and ``dtype``."""
        shape = normalize_shape(shape)
        dtype = _normalize_dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize if shape else dtype.itemsize
        return cls(_core.SharedSegment.create(nbytes, _KIND), shape, dtype)

    @classmethod
    def attach(cls, handle: SharedArrayHandle) -> "SharedArray":
        """Map the array described by ``handle`` (from ``.handle`` in another process).

        Raises ``tensorxfer.CorruptSegmentError`` if the segment fails validation
        or its size does not match the handle's shape and dtype.
        """
        if not isinstance(handle, SharedArrayHandle):
            raise TypeError(f"handle must be a SharedArrayHandle, got {type(handle).__name__}")
        shape = normalize_shape(handle.shape)
        dtype = _normalize_dtype(handle.dtype)
        segment = _core.SharedSegment.attach(handle.name, _KIND)
        expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize if shape else dtype.itemsize
        if segment.nbytes != expected:
            got = segment.nbytes
            segment.detach()
            from tensorxfer.errors import CorruptSegmentError

            raise CorruptSegmentError(
                f"SharedArray {handle.name}: segment holds {got} bytes, "
                f"expected {expected} for shape {shape} dtype {dtype}"
            )
        return cls(segment, shape, dtype)

    @property
    def handle(self) -> SharedArrayHandle:
        """A small picklable handle for :meth:`attach` in another process."""
        self._ensure_open()
        return SharedArrayHandle(self._segment.name, tuple(self._array.shape), self._array.dtype.str)

    @property
    def name(self) -> str:
        """The shared-memory name."""
        return self._segment.name

    @property
    def array(self) -> np.ndarray:
        """The numpy view (zero-copy)."""
        self._ensure_open()
        return self._array

    @property
    def shape(self) -> Tuple[int, ...]:
        """The array's shape."""
        return tuple(self._array.shape)

    @property
    def dtype(self) -> np.dtype:
        """The array's dtype."""
        return self._array.dtype

    @property
    def nbytes(self) -> int:
        """Bytes of array data."""
        return int(self._array.nbytes)

    def tensor(self) -> Any:
        """A zero-copy torch CPU tensor of the array (needs torch)."""
        import torch

        return torch.from_numpy(self.array)

    def close(self) -> None:
        """Detach; the creator (or the last user) removes the shared-memory name. Idempotent."""
        super().close()

    def _release(self) -> None:
        self._segment.detach()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"SharedArray(name={self.name!r}, shape={self.shape}, dtype={self.dtype}, {state})"
