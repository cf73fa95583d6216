"""Native row packing: gather indexed rows of several sources into one buffer.

``PackLayout`` names the fields of a packed batch (dtype and row shape each)
and places them one after the other, every field starting on a 64-byte
boundary. ``pack_rows`` gathers the rows chosen by an index vector from each
field's source (e.g. a replay store in shared memory) into a packed buffer
with the native copy engine's threads, the GIL released. ``layout.unpack``
returns zero-copy views of the packed fields::

    layout = PackLayout({"obs": ("float32", (64,)), "action": ("float32", (8,)),
                         "reward": ("float32", ())}, rows=256)
    batch = numpy.empty(layout.nbytes, numpy.uint8)
    pack_rows(batch, layout, sources={"obs": obs, "action": act, "reward": rew},
              indices=idx)
    fields = layout.unpack(batch)      # {"obs": (256, 64) float32 view, ...}
"""

from __future__ import annotations

import operator
import os
import sys
import threading
from typing import Any, Dict, Mapping, Optional, Tuple

import numpy as np

from tensorxfer import _core
from tensorxfer._tensor import as_view, is_torch_tensor, native_view

ALIGNMENT = 64
"""Byte alignment of every field's offset (and of ``PackLayout.nbytes``)."""

_INDEX_DTYPES = (np.dtype(np.int32), np.dtype(np.int64))


def _dtype_name(dtype: Any, field: str) -> str:
    """Canonical dtype name ("float32", ...) of a name, numpy dtype or torch dtype."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(dtype, torch.dtype):
        return str(dtype).split(".", 1)[1]
    if dtype is None:
        raise TypeError(f"field {field!r}: expected a dtype (name, numpy or torch dtype), got None")
    if isinstance(dtype, str) and dtype == "bfloat16":
        return dtype
    try:
        resolved = np.dtype(dtype)
    except TypeError as error:
        raise TypeError(f"field {field!r}: unsupported dtype {dtype!r} ({error})") from None
    if resolved.byteorder == ">":
        raise TypeError(f"field {field!r}: big-endian dtype {dtype!r} is not supported")
    return resolved.name


def _row_shape(shape: Any, field: str) -> Tuple[int, ...]:
    if isinstance(shape, (int, np.integer)):
        return (operator.index(shape),)
    try:
        return tuple(operator.index(extent) for extent in shape)
    except TypeError:
        raise TypeError(
            f"field {field!r}: expected a row shape (tuple of ints, () for a scalar), got {shape!r}"
        ) from None


class PackLayout:
    """Where each named field's rows go in a packed buffer.

    Fields are laid out in mapping order, each at a 64-byte aligned offset. A layout is
    picklable, so collector processes can receive it.

    Args:
        fields: maps a name to ``(dtype, row_shape)``: the dtype as a name
            (``"float32"``), numpy dtype or torch dtype; the row shape a tuple (``()`` for
            one scalar per row).
        rows: the batch size.

    Raises:
        ValueError: no fields, negative rows or extents.
        TypeError: an unknown dtype.

    Example:
        >>> layout = PackLayout({"obs": ("float32", (4,)), "reward": ("float32", ())}, rows=8)
        >>> layout.offsets["reward"], layout.nbytes
        (128, 192)
    """

    def __init__(self, fields: Mapping[str, Tuple[Any, Any]], rows: int) -> None:
        if not isinstance(fields, Mapping):
            raise TypeError(f"fields: expected a mapping name -> (dtype, row_shape), got {type(fields).__name__}")
        specs = []
        for name, spec in fields.items():
            if not isinstance(name, str):
                raise TypeError(f"fields: names must be strings, got {name!r}")
            if not isinstance(spec, (tuple, list)) or len(spec) != 2:
                raise TypeError(f"field {name!r}: expected (dtype, row_shape), got {spec!r}")
            specs.append((name, _dtype_name(spec[0], name), _row_shape(spec[1], name)))
        try:
            rows = operator.index(rows)
        except TypeError:
            raise TypeError(f"rows: expected an integer, got {rows!r}") from None
        self._native = _core.PackLayout(specs, rows)
        described = self._native.fields
        self._fields: Dict[str, Tuple[str, Tuple[int, ...]]] = {
            name: (dtype, tuple(shape)) for name, dtype, shape, _, _ in described
        }
        self._offsets: Dict[str, int] = {name: offset for name, _, _, offset, _ in described}
        self._row_nbytes: Dict[str, int] = {name: size for name, _, _, _, size in described}

    @property
    def rows(self) -> int:
        """Rows per field (the batch size)."""
        return self._native.rows

    @property
    def nbytes(self) -> int:
        """Bytes a packed buffer needs (a multiple of 64)."""
        return self._native.nbytes

    @property
    def fields(self) -> Dict[str, Tuple[str, Tuple[int, ...]]]:
        """``{name: (dtype name, row shape)}`` in packing order (a copy)."""
        return dict(self._fields)

    @property
    def offsets(self) -> Dict[str, int]:
        """``{name: byte offset}`` of each field in the packed buffer (multiples of 64)."""
        return dict(self._offsets)

    @property
    def row_nbytes(self) -> Dict[str, int]:
        """``{name: bytes of one row}``."""
        return dict(self._row_nbytes)

    def unpack(self, dst: Any) -> Dict[str, Any]:
        """Zero-copy views of each field in the packed buffer ``dst``.

        Returns ``{name: view of shape (rows, *row_shape)}``: torch tensors if
        ``dst`` is a torch tensor (any device), numpy arrays otherwise (numpy
        arrays and buffer-protocol objects). ``dst`` must be contiguous and
        hold at least ``nbytes`` bytes.
        """
        if is_torch_tensor(dst):
            return self._unpack_torch(dst)
        array = dst if isinstance(dst, np.ndarray) else np.asarray(dst)
        if not array.flags.c_contiguous:
            raise ValueError(f"dst must be C-contiguous, got strides {array.strides} for shape {array.shape}")
        self._check_size(array.nbytes)
        flat = array.reshape(-1).view(np.uint8)
        views = {}
        for name, (dtype, shape) in self._fields.items():
            if dtype == "bfloat16":
                raise TypeError(
                    f"field {name!r} has dtype bfloat16, which numpy cannot represent; unpack a torch tensor instead"
                )
            offset = self._offsets[name]
            size = self._row_nbytes[name] * self.rows
            views[name] = flat[offset : offset + size].view(np.dtype(dtype)).reshape((self.rows,) + shape)
        return views

    def _unpack_torch(self, dst: Any) -> Dict[str, Any]:
        import torch

        if not dst.is_contiguous():
            raise ValueError(f"dst must be contiguous, got strides {tuple(dst.stride())} for shape {tuple(dst.shape)}")
        self._check_size(dst.numel() * dst.element_size())
        flat = dst.reshape(-1).view(torch.uint8)
        views = {}
        for name, (dtype, shape) in self._fields.items():
            offset = self._offsets[name]
            size = self._row_nbytes[name] * self.rows
            views[name] = flat[offset : offset + size].view(getattr(torch, dtype)).view((self.rows,) + shape)
        return views

    def _check_size(self, nbytes: int) -> None:
        if nbytes < self.nbytes:
            raise ValueError(f"dst: expected at least layout.nbytes = {self.nbytes} bytes, got {nbytes}")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PackLayout):
            return NotImplemented
        return self.rows == other.rows and list(self._fields.items()) == list(other._fields.items())

    def __hash__(self) -> int:
        return hash((self.rows, tuple(self._fields.items())))

    def __reduce__(self):
        return (PackLayout, (self.fields, self.rows))

    def __repr__(self) -> str:
        parts = ", ".join(f"{name!r}: ({dtype!r}, {shape})" for name, (dtype, shape) in self._fields.items())
        return f"PackLayout({{{parts}}}, rows={self.rows}) # nbytes={self.nbytes}"


# ---- the engine pack_rows uses when given none -------------------------------

# One engine per process and poll setting, created on first use.
_default_engines: Dict[Optional[int], _core.CopyEngine] = {}
_default_engines_lock = threading.Lock()
# Engines inherited through fork(): their threads exist only in the parent, so
# they are kept (never destroyed) and new engines are made in the child.
_engines_from_parent: list = []


def _forget_engines_after_fork() -> None:
    global _default_engines_lock
    _engines_from_parent.extend(_default_engines.values())
    _default_engines.clear()
    _default_engines_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_engines_after_fork)


def default_copy_engine(idle_spin_us: Optional[int] = None) -> _core.CopyEngine:
    """The ``CopyEngine`` that ``pack_rows`` uses when ``engine`` is None.

    Created on first use, one per process (a forked child makes its own), with
    the engine's defaults: jobs use up to one thread per core (at most 8, the
    caller included); while calls come back to back a worker polls 50 us
    for the next one, otherwise the workers sleep between jobs. The native core
    itself keeps no global engine; this one lives in this module.

    ``idle_spin_us`` asks for the engine with that back-to-back poll instead
    (each setting has its own engine in the process): the copy services use 0,
    because their ranks copy in step with peer processes on the same cores.
    """
    engine = _default_engines.get(idle_spin_us)
    if engine is None:
        with _default_engines_lock:
            engine = _default_engines.get(idle_spin_us)
            if engine is None:
                engine = _core.CopyEngine() if idle_spin_us is None else _core.CopyEngine(idle_spin_us=idle_spin_us)
                _default_engines[idle_spin_us] = engine
    return engine


def _indices_view(indices: Any) -> Any:
    if type(indices) is np.ndarray and indices.dtype in _INDEX_DTYPES and indices.flags.c_contiguous:
        return native_view(indices, "indices")  # the common case, checked natively
    if is_torch_tensor(indices):
        import torch

        if indices.dtype not in (torch.int32, torch.int64):
            if indices.dtype.is_floating_point or indices.dtype.is_complex or indices.dtype == torch.bool:
                raise TypeError(f"indices: expected integers (int32 or int64), got {indices.dtype}")
            indices = indices.to(torch.int64)
        return as_view(indices.contiguous(), "indices", host=True)
    array = np.asarray(indices)
    if array.size == 0 and array.dtype.kind not in "iu":
        array = array.astype(np.int64)
    if array.dtype.kind not in "iu":
        raise TypeError(f"indices: expected integers (int32 or int64), got dtype {array.dtype}")
    if array.dtype not in _INDEX_DTYPES:
        array = array.astype(np.int64)
    return as_view(np.ascontiguousarray(array), "indices", host=True)


def pack_rows(
    dst: Any,
    layout: PackLayout,
    sources: Mapping[str, Any],
    indices: Any,
    engine: Optional[_core.CopyEngine] = None,
) -> None:
    """Gathers ``sources[f][indices]`` for every field ``f`` of ``layout`` into ``dst``.

    Every index is checked before anything is written.

    Args:
        dst: a contiguous, writable host buffer (numpy array, torch tensor, any dtype:
            it is used as bytes) of at least ``layout.nbytes`` bytes.
        layout: where each field's rows go in ``dst``.
        sources: exactly one entry per field, each a contiguous host tensor of shape
            ``(N, *row_shape)`` and the field's dtype.
        indices: ``layout.rows`` integers (int32/int64 used as is; any container numpy
            accepts), each in ``[0, N)`` for every source.
        engine: the ``CopyEngine`` whose threads do the work with the caller (GIL
            released); None uses :func:`~tensorxfer.ipc.pack.default_copy_engine`.

    Raises:
        ValueError: missing or extra fields, shapes, sizes, out-of-range indices,
            non-contiguous or non-host inputs (the field named).
        TypeError: a dtype that does not match its field (the field named).
    """
    if not isinstance(layout, PackLayout):
        raise TypeError(f"layout: expected a tensorxfer.ipc.PackLayout, got {type(layout).__name__}")
    if not isinstance(sources, Mapping):
        raise TypeError(f"sources: expected a mapping field name -> tensor, got {type(sources).__name__}")
    expected = layout._fields
    if sources.keys() != expected.keys():
        missing = [name for name in expected if name not in sources]
        extra = [name for name in sources if name not in expected]
        problems = []
        if missing:
            problems.append(f"missing fields {missing}")
        if extra:
            problems.append(f"unexpected fields {extra}")
        raise ValueError(f"sources: {', '.join(problems)} (the layout has {list(expected)})")
    # The native pack_rows checks host memory, contiguity and writability itself.
    dst_view = native_view(dst, "dst")
    pairs = [(name, native_view(sources[name], f"sources[{name!r}]")) for name in expected]
    index_view = _indices_view(indices)
    if engine is None:
        engine = default_copy_engine()
    elif not isinstance(engine, _core.CopyEngine):
        raise TypeError(f"engine: expected a CopyEngine or None, got {type(engine).__name__}")
    _core.pack_rows(dst_view, layout._native, pairs, index_view, engine)


__all__ = ["ALIGNMENT", "PackLayout", "pack_rows", "default_copy_engine"]
