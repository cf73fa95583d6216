"""Torch-side helpers of the replay backends: importing torch on demand, parsing
and checking devices (errors say what is missing), turning host slots into
torch tensors and taking byte prefixes of tensors."""

from __future__ import annotations

import warnings
from typing import Any, Tuple

from tensorxfer.errors import UnsupportedError


def import_torch(purpose: str):
    """``import torch``, or ``UnsupportedError`` saying that ``purpose`` needs it."""
    try:
        import torch
    except ImportError as error:
        raise UnsupportedError(
            f"{purpose} needs torch, which is not installed (pip install tensorxfer[torch])"
        ) from error
    return torch


def parse_device_without_torch(device: Any) -> str:
    """Accepts the host device ("cpu", "cpu:N") as a string when torch is absent."""
    if not isinstance(device, str):
        raise TypeError(f"device must be a str or torch.device, got {type(device).__name__} {device!r}")
    text = device.strip().lower()
    kind, _, index = text.partition(":")
    if kind == "cpu" and (not index or index.isdigit()):
        return "cpu"
    raise UnsupportedError(
        f"device {device!r} needs torch, which is not installed (pip install tensorxfer[torch]); "
        "without torch only device 'cpu' is available"
    )


def parse_device(torch, device: Any):
    """A ``torch.device`` from a ``torch.device`` or a device string."""
    if isinstance(device, torch.device):
        return device
    if not isinstance(device, str):
        raise TypeError(f"device must be a str or torch.device, got {type(device).__name__} {device!r}")
    try:
        return torch.device(device)
    except RuntimeError as error:
        raise ValueError(f"device {device!r} is not a valid torch device string: {error}") from error


def _torch_build(torch) -> str:
    if torch.version.hip:
        return f"torch {torch.__version__} is a ROCm {torch.version.hip} build"
    if torch.version.cuda:
        return f"torch {torch.__version__} is built for CUDA {torch.version.cuda}"
    return f"torch {torch.__version__} is a CPU-only build"


def _require_indexed(device, runtime_name: str, runtime):
    """``device`` with its index (default: the runtime's current device), which must be visible."""
    count = runtime.device_count()
    index = runtime.current_device() if device.index is None and count else (device.index or 0)
    if index >= count:
        raise UnsupportedError(
            f"device '{device}' requested but only {count} {runtime_name} device(s) are visible"
        )
    return type(device)(device.type, index)


def require_present_device(torch, device):
    """Checks that ``device`` exists on this machine; returns it with its index
    resolved (cuda/xpu).  ``UnsupportedError`` names what is missing."""
    kind = device.type
    if kind == "cpu":
        return device
    if kind == "cuda":
        if not torch.cuda.is_available():
            hint = (
                "" if not (torch.version.cuda or torch.version.hip)
                else ", no GPU is visible: check the driver and CUDA_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES"
            )
            raise UnsupportedError(
                f"device '{device}' requested but torch.cuda.is_available() is False ({_torch_build(torch)}{hint})"
            )
        return _require_indexed(device, "HIP" if torch.version.hip else "CUDA", torch.cuda)
    if kind == "xpu":
        xpu = getattr(torch, "xpu", None)
        if xpu is None:
            raise UnsupportedError(f"device '{device}' requested but torch {torch.__version__} has no torch.xpu module")
        if not xpu.is_available():
            raise UnsupportedError(
                f"device '{device}' requested but torch.xpu.is_available() is False (torch {torch.__version__}: "
                "no XPU support in this build or no Intel GPU visible)"
            )
        return _require_indexed(device, "XPU", xpu)
    if kind == "mps":
        if not torch.backends.mps.is_available():
            raise UnsupportedError(
                f"device '{device}' requested but torch.backends.mps.is_available() is False "
                f"(MPS needs macOS 12.3+ on Apple silicon and a torch build with MPS; {_torch_build(torch)})"
            )
        return device
    if kind == "meta":
        raise UnsupportedError(f"device '{device}' holds no data; a replay transfer needs a real device")
    runtime = getattr(torch, kind, None)
    is_available = getattr(runtime, "is_available", None)
    if callable(is_available) and not is_available():
        raise UnsupportedError(f"device '{device}' requested but torch.{kind}.is_available() is False")
    try:
        torch.empty(0, device=device)
    except (RuntimeError, NotImplementedError) as error:
        raise UnsupportedError(f"device '{device}' requested but torch cannot allocate on it: {error}") from error
    return device


def describe_tensor(tensor) -> str:
    """``"float32[4, 8] on cpu"`` style text for messages."""
    dtype = str(tensor.dtype).replace("torch.", "")
    return f"{dtype}{list(tensor.shape)} on {tensor.device}"


def as_torch_tensor(torch, obj: Any, name: str, *, writable: bool = False):
    """A torch tensor sharing ``obj``'s memory: torch tensors as they are (detached),
    numpy arrays through ``torch.from_numpy`` and other DLPack / buffer objects
    through ``torch.from_dlpack`` / numpy.  ``writable`` refuses read-only arrays."""
    if isinstance(obj, torch.Tensor):
        return obj.detach()
    import numpy

    if not isinstance(obj, numpy.ndarray):
        if hasattr(obj, "__dlpack__"):
            return torch.from_dlpack(obj)
        try:
            obj = numpy.asarray(memoryview(obj))  # buffer-protocol objects only: never a copy
        except TypeError as error:
            raise TypeError(
                f"{name} must be a torch tensor, numpy array, or an object with __dlpack__ or the buffer protocol, "
                f"got {type(obj).__name__}"
            ) from error
    if writable and not obj.flags.writeable:
        raise ValueError(f"{name} must be writable, got a read-only numpy array {obj.dtype}{list(obj.shape)}")
    with warnings.catch_warnings():
        # Read-only arrays (host slots shared read-only) are only read from.
        warnings.simplefilter("ignore", UserWarning)
        try:
            return torch.from_numpy(obj)
        except TypeError as error:
            raise TypeError(f"{name}: torch cannot view numpy dtype {obj.dtype}: {error}") from error


def on_device(tensor, device) -> bool:
    """True when ``tensor`` lives on ``device`` (an index-less device matches any index)."""
    actual = tensor.device
    if actual.type != device.type:
        return False
    return device.index is None or (actual.index or 0) == device.index


def require_contiguous_on(tensor, name: str, device) -> None:
    """``tensor`` must be C-contiguous and on ``device``."""
    if not on_device(tensor, device):
        raise ValueError(f"{name} must be on device {device}, got {describe_tensor(tensor)}")
    if not tensor.is_contiguous():
        raise ValueError(
            f"{name} must be C-contiguous, got {describe_tensor(tensor)} with strides {tuple(tensor.stride())} "
            "(call .contiguous() first)"
        )


def prepare_torch_copy(torch, *, dst: Any, src: Any, h2d_bytes: Any, device):
    """Validates a host-to-device copy and returns ``(dst, src, nbytes)`` as torch
    tensors ready for ``dst.copy_(src)`` (flat byte views when only a prefix or a
    differently shaped buffer of the same size is copied)."""
    from tensorxfer.ipc.replay_pipelines.transfer._common import resolve_h2d_nbytes

    dst_tensor = as_torch_tensor(torch, dst, "dst", writable=True)
    src_tensor = as_torch_tensor(torch, src, "src")
    require_contiguous_on(dst_tensor, "dst", device)
    require_contiguous_on(src_tensor, "src", torch.device("cpu"))
    dst_dtype, dst_nbytes = torch_dtype_text(dst_tensor)
    src_dtype, src_nbytes = torch_dtype_text(src_tensor)
    nbytes = resolve_h2d_nbytes(
        dst_dtype=dst_dtype, dst_nbytes=dst_nbytes, describe_dst=lambda: describe_tensor(dst_tensor),
        src_dtype=src_dtype, src_nbytes=src_nbytes, describe_src=lambda: describe_tensor(src_tensor),
        h2d_bytes=h2d_bytes,
    )
    if nbytes == dst_nbytes == src_nbytes and dst_tensor.shape == src_tensor.shape:
        return dst_tensor, src_tensor, nbytes
    return byte_prefix(torch, dst_tensor, nbytes), byte_prefix(torch, src_tensor, nbytes), nbytes


def host_slot_tensors(torch, slots, *, prefault: bool):
    """The host slots as contiguous CPU torch tensors (errors name ``slots[i]``);
    ``prefault`` maps their pages in (content untouched)."""
    from tensorxfer.ipc.replay_pipelines.transfer import _host_memory

    cpu = torch.device("cpu")
    tensors = []
    for index, slot in enumerate(slots):
        tensor = as_torch_tensor(torch, slot, f"slots[{index}]")
        require_contiguous_on(tensor, f"slots[{index}]", cpu)
        tensors.append(tensor)
    if prefault:
        from tensorxfer._tensor import as_view

        for index, tensor in enumerate(tensors):
            argument = f"slots[{index}]"
            _host_memory.prefault(as_view(tensor, argument, host=True), argument)
    return tensors


def torch_dtype_text(tensor) -> Tuple[str, int]:
    """(dtype name without the ``torch.`` prefix, size in bytes)."""
    return str(tensor.dtype).replace("torch.", ""), tensor.numel() * tensor.element_size()


def byte_prefix(torch, tensor, nbytes: int):
    """The first ``nbytes`` bytes of a contiguous tensor as a flat uint8 tensor (a view)."""
    flat = tensor.reshape(-1)
    if flat.dtype != torch.uint8:
        flat = flat.view(torch.uint8)
    return flat if nbytes == flat.numel() else flat[:nbytes]


def torch_allocate(torch, count: int, shape, dtype: Any, device):
    """``count`` zeroed tensors on ``device``; numpy dtypes / names map to the torch dtype."""
    from tensorxfer.ipc.replay_pipelines.transfer._common import numpy_dtype

    if not isinstance(dtype, torch.dtype):
        numpy_type = numpy_dtype(dtype)
        import numpy

        try:
            dtype = torch.from_numpy(numpy.empty(0, dtype=numpy_type)).dtype
        except TypeError as error:
            raise TypeError(f"dtype {numpy_type} has no torch equivalent") from error
    return [torch.zeros(shape, dtype=dtype, device=device) for _ in range(count)]


__all__ = [
    "as_torch_tensor",
    "byte_prefix",
    "describe_tensor",
    "host_slot_tensors",
    "import_torch",
    "parse_device",
    "on_device",
    "parse_device_without_torch",
    "prepare_torch_copy",
    "require_contiguous_on",
    "require_present_device",
    "torch_allocate",
    "torch_dtype_text",
]
