"""How the copy services see user tensors: as host byte spans, or as objects
to stage when they are not contiguous (private).

Tensors are numpy arrays or torch tensors; other buffer-protocol / DLPack
objects are wrapped once at submit time. Every copy moves bytes: a send and
its receive must agree in byte size, not in dtype or shape.
"""

from __future__ import annotations

import sys
from typing import Any, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from tensorxfer import _core
from tensorxfer.resharding._copy_engine import resharding_copy_engine


class TensorInfo(NamedTuple):
    """What a run needs to know about one submitted tensor."""

    address: int  # first byte (meaningful when contiguous)
    nbytes: int
    contiguous: bool
    host: bool


def _torch() -> Any:
    return sys.modules.get("torch")


def is_torch(obj: Any) -> bool:
    """True for torch tensors (without importing torch)."""
    torch = _torch()
    return torch is not None and isinstance(obj, torch.Tensor)


def torch_tensor_type() -> type:
    """torch.Tensor, or a type nothing has while torch is not imported."""
    torch = _torch()
    return torch.Tensor if torch is not None else _NoTensor


class _NoTensor:
    """Stands for torch.Tensor while torch is not imported (nothing has this type)."""


def normalize_fast(obj: Any, argument: str, writable: bool, host_only: bool, backend: str) -> Any:
    """normalize() plus the host check, with a fast path for the common cases
    (a writable numpy array, a CPU torch tensor)."""
    if type(obj) is not np.ndarray and not is_torch(obj):
        obj = normalize(obj, argument, writable)  # ndarray subclasses come back as they are
    if isinstance(obj, np.ndarray):
        if (writable and not obj.flags.writeable) or obj.dtype.hasobject:
            return normalize(obj, argument, writable)  # raises, naming the argument
        return obj
    if host_only and not obj.is_cpu:
        raise ValueError(f"{argument}: {backend} moves host (cpu) tensors only, got one on {obj.device}")
    return obj


def normalize(obj: Any, argument: str, writable: bool) -> Any:
    """``obj`` as a numpy array or torch tensor sharing its memory.

    TypeError naming ``argument`` for objects that are neither, nor buffer /
    DLPack exporters; ValueError for a read-only destination.
    """
    if isinstance(obj, np.ndarray) or is_torch(obj):
        result = obj
    else:
        try:
            result = np.asarray(memoryview(obj))
        except TypeError:
            if not hasattr(obj, "__dlpack__"):
                raise TypeError(
                    f"{argument}: expected a numpy array, torch tensor, buffer or DLPack object, "
                    f"got {type(obj).__name__}"
                ) from None
            import torch

            result = torch.from_dlpack(obj)
    if writable and isinstance(result, np.ndarray) and not result.flags.writeable:
        raise ValueError(f"{argument}: expected a writable array, got a read-only one of shape {result.shape}")
    if isinstance(result, np.ndarray) and result.dtype.hasobject:
        raise TypeError(f"{argument}: arrays of Python objects cannot be copied as bytes (dtype {result.dtype})")
    return result


def describe(obj: Any) -> TensorInfo:
    """Address, byte size, contiguity and host residence of a normalized tensor."""
    if isinstance(obj, np.ndarray):
        return TensorInfo(obj.ctypes.data, obj.nbytes, obj.flags.c_contiguous, True)
    return TensorInfo(obj.data_ptr(), obj.nbytes, obj.is_contiguous(), obj.device.type == "cpu")


class Spans(NamedTuple):
    """TensorInfo of many tensors at once, as arrays."""

    address: np.ndarray  # uint64
    nbytes: np.ndarray  # int64
    contiguous: np.ndarray  # bool
    host: np.ndarray  # bool


_CONTIGUOUS, _HOST, _UNKNOWN = 1, 2, 8


def describe_many(objects: list, rows: Optional[np.ndarray] = None) -> Spans:
    """describe() of every normalized tensor in ``objects``, natively (one call; plain torch
    tensors through their own methods, the rest through the buffer protocol). ``rows``: the
    description the submit queue took with the ops (see _queue), of which only the rows
    flagged undescribed are described here."""
    if rows is None:
        rows = _native_rows(objects)
    else:
        undescribed = np.flatnonzero(rows[:, 2] & _UNKNOWN)
        if undescribed.size == len(objects):
            rows = _native_rows(objects)
        elif undescribed.size:
            rows[undescribed] = _native_rows([objects[int(i)] for i in undescribed])
    flags = rows[:, 2]
    return Spans(rows[:, 0].copy(), rows[:, 1].astype(np.int64), (flags & _CONTIGUOUS) != 0, (flags & _HOST) != 0)


def _native_rows(objects: list) -> np.ndarray:
    """(address, nbytes, flags) rows of ``objects`` (see describe_many)."""
    tensor_type = torch_tensor_type()
    if objects and type(objects[0]) is tensor_type and set(map(type, objects)) == {tensor_type}:
        return _core.describe_torch_tensors(objects)
    rows = _core.describe_spans(objects)
    for i in np.flatnonzero(rows[:, 2] & _UNKNOWN):  # formats the buffer protocol refuses (e.g. datetime64)
        info = describe(objects[int(i)])
        rows[i] = (info.address, info.nbytes,
                   (_CONTIGUOUS if info.contiguous else 0) | (_HOST if info.host else 0))
    return rows


def contiguous(obj: Any) -> Any:
    """A C-contiguous tensor with obj's contents (obj itself when it already is)."""
    if isinstance(obj, np.ndarray):
        return np.ascontiguousarray(obj)
    return obj.contiguous()


def empty_like(obj: Any) -> Any:
    """A new C-contiguous tensor of obj's shape, dtype and device."""
    if isinstance(obj, np.ndarray):
        return np.empty(obj.shape, obj.dtype)
    return _torch().empty(obj.shape, dtype=obj.dtype, device=obj.device)


def flat_bytes(obj: Any) -> Any:
    """A 1-D uint8 view of a contiguous tensor (same library, same memory)."""
    if isinstance(obj, np.ndarray):
        return obj.reshape(-1).view(np.uint8)
    torch = _torch()
    flat = obj.reshape(-1)
    return flat if flat.dtype == torch.uint8 else flat.view(torch.uint8)


def copy_bytes_into(dst: Any, src: Any) -> None:
    """Copies the bytes of the contiguous tensor ``src`` into ``dst`` (any layout,
    any device), read as dst's dtype and shape. Byte sizes must be equal."""
    src_bytes = flat_bytes(src)
    if isinstance(dst, np.ndarray):
        if not isinstance(src_bytes, np.ndarray):
            src_bytes = src_bytes.cpu().numpy()
        np.copyto(dst, src_bytes.view(dst.dtype).reshape(dst.shape), casting="no")
        return
    torch = _torch()
    if isinstance(src_bytes, np.ndarray):
        src_bytes = torch.from_numpy(src_bytes)
    dst.copy_(src_bytes.view(dst.dtype).view(dst.shape))


def copy_host_spans(sources: Any, destinations: Any, nbytes: Any) -> None:
    """Copies nbytes[i] bytes from host address sources[i] to destinations[i] for
    every i, natively (GIL released, on the default copy engine's threads)."""
    spans = np.empty((len(nbytes), 3), np.uint64)
    spans[:, 0] = sources
    spans[:, 1] = destinations
    spans[:, 2] = nbytes
    _core.copy_spans(spans, resharding_copy_engine())


def sources_as_now(tensors: Sequence[Any], spans: Spans) -> Tuple[List[Any], np.ndarray]:
    """The sources as they are now (after the caller's writes) and their uint64
    addresses: non-contiguous ones copied once into contiguous tensors."""
    objects = list(tensors)
    addresses = spans.address.astype(np.uint64)
    for i in np.flatnonzero(~spans.contiguous):
        objects[i] = contiguous(objects[i])
        addresses[i] = describe(objects[i]).address
    return objects, addresses


def staged_targets(tensors: Sequence[Any], spans: Spans) -> Tuple[List[Any], np.ndarray, List[Tuple[Any, Any]]]:
    """The destinations as a transport sees them and their uint64 addresses:
    non-contiguous ones replaced by contiguous staging, with the (destination,
    staging) pairs to copy back (:func:`copy_back`) once the bytes arrived."""
    targets = list(tensors)
    addresses = spans.address.astype(np.uint64)
    pending: List[Tuple[Any, Any]] = []
    for i in np.flatnonzero(~spans.contiguous):
        staged = empty_like(targets[i])
        pending.append((targets[i], staged))
        targets[i] = staged
        addresses[i] = describe(staged).address
    return targets, addresses, pending


def copy_back(pending: Sequence[Tuple[Any, Any]]) -> None:
    """Copies each staging tensor into its destination (see :func:`staged_targets`)."""
    for target, staged in pending:
        copy_bytes_into(target, staged)


def copy_pairs(pairs: Tuple[np.ndarray, np.ndarray], send_tensors: Sequence[Any],
               recv_tensors: Sequence[Any], send_spans: Spans, recv_spans: Spans) -> None:
    """Copies each same-rank pair (send row, receive row): natively when both are
    contiguous host tensors, else through numpy / torch."""
    sources, targets = pairs
    moving = send_spans.nbytes[sources] != 0
    direct = (moving & send_spans.contiguous[sources] & recv_spans.contiguous[targets]
              & send_spans.host[sources] & recv_spans.host[targets])
    for k in np.flatnonzero(moving & ~direct):
        i, j = int(sources[k]), int(targets[k])
        copy_bytes_into(recv_tensors[j], contiguous(send_tensors[i]))
    if direct.any():
        copy_host_spans(send_spans.address[sources[direct]], recv_spans.address[targets[direct]],
                        send_spans.nbytes[sources[direct]])
