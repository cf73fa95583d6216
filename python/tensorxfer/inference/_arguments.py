"""Argument checks shared by the unified-memory calls."""

from __future__ import annotations

import operator
import sys
from typing import Any

from tensorxfer import _core
from tensorxfer._tensor import as_view
from tensorxfer.inference._errors import UnifiedMemoryUnsupportedError


def device_id(device: Any, *, gpu_only: bool = False) -> int:
    """``device`` as an int: -1 (the CPU, unless ``gpu_only``) or a GPU id >= 0."""
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


def view_of(tensor: Any, name: str) -> Any:
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


def require_gpu(device: int, operation: str) -> None:
    """Raises UnifiedMemoryUnsupportedError, with the CUDA runtime's reason, when no GPU is usable."""
    status = _core.cuda_status()
    if status["device_count"] == 0:
        raise UnifiedMemoryUnsupportedError(
            f"{operation}: GPU device {device} was requested but no CUDA device is usable: {status['reason']}"
        )


def stream_handle(stream: Any) -> int:
    """The cudaStream_t of ``stream`` (None: torch's current stream, or 0 without CUDA)."""
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
