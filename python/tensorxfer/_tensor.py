"""The one place that turns user objects into native tensor views.

Accepted: numpy arrays and anything with the buffer protocol, torch tensors
and anything with ``__dlpack__``.  Every check names the argument, shows its
shape/strides/dtype/device and says what was expected.

A view owns what keeps the memory valid while native code uses it: for a
buffer-protocol object the buffer export itself (so a ``bytearray`` cannot be
resized nor an ``mmap`` closed under a queued copy: ``BufferError``), for a
DLPack producer the consumed tensor (its deleter runs when the view dies).
DLPack is asked for the versioned protocol (``max_version=(1, 0)``, legacy
capsule for producers that do not take it); a producer's read-only flag makes
the view read-only, and a read-only view is refused wherever it would be written.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tensorxfer import _core

TensorView = _core.TensorView


def _prepare(obj: Any) -> Any:
    # torch refuses to export tensors that require grad or carry lazy conj/neg bits.
    if getattr(obj, "requires_grad", False):
        obj = obj.detach()
    if getattr(obj, "is_conj", None) is not None and obj.is_conj():
        obj = obj.resolve_conj()
    if getattr(obj, "is_neg", None) is not None and obj.is_neg():
        obj = obj.resolve_neg()
    return obj


def as_view(
    obj: Any,
    name: str,
    *,
    host: bool = False,
    contiguous: bool = True,
    writable: bool = False,
) -> TensorView:
    """View ``obj`` for the native core; ``name`` is the argument name used in errors.

    ``host`` requires host memory, ``contiguous`` a C-contiguous layout and
    ``writable`` a writable buffer.  The returned view keeps ``obj`` alive
    and, for buffer-protocol objects, holds their buffer export.
    """
    if isinstance(obj, TensorView):
        view = obj
    else:
        view = _core.make_view(_prepare(obj), name)
    if host and not view.is_host:
        raise ValueError(f"{name} must be in host memory (device cpu), got {view.describe()}")
    if contiguous and not view.is_contiguous:
        raise ValueError(
            f"{name} must be C-contiguous, got {view.describe()} "
            "(call .contiguous() / numpy.ascontiguousarray first)"
        )
    if writable and view.readonly:
        raise ValueError(f"{name} must be writable, got a read-only {view.describe()}")
    return view


def native_view(obj: Any, name: str) -> TensorView:
    """View ``obj`` without the checks of :func:`as_view`, for callers whose native
    function checks the same things itself (with the same messages)."""
    if isinstance(obj, TensorView):
        return obj
    if type(obj) is np.ndarray:
        return _core.make_view(obj, name)  # nothing to prepare on a numpy array
    return _core.make_view(_prepare(obj), name)


def is_torch_tensor(obj: Any) -> bool:
    """True for torch tensors, without importing torch when it is not loaded."""
    import sys

    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)
