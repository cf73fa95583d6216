"""tensorxfer: move tensors for training and inference jobs.

Subpackages:

* ``tensorxfer.ipc`` -- shared slot rings between processes (``SlotRing``),
  native row packing (``PackLayout``, ``pack_rows``) and the replay-pipeline
  host-to-device transfer backends (``tensorxfer.ipc.replay_pipelines.transfer``).
* ``tensorxfer.inference.unified_memory`` -- managed memory pools, prefetch and
  placement advice.

Importing the package prints nothing, starts no threads and does not import
torch; it registers the ``"tensorxfer"`` torch.distributed backend once torch
is imported (``tensorxfer.distributed``).
"""

from tensorxfer import _core
from tensorxfer.errors import (
    ClosedError,
    CorruptSegmentError,
    PeerLost,
    PeerLostError,
    TensorxferError,
    UnsupportedError,
)

__version__: str = _core.__version__

# TENSORXFER_CPU_VECTOR_SET, _CACHE_BYTES and _COUNT force the branches another CPU would take
# (docs: developing); a value the core could not use must not pass silently.
if _cpu_override_error := _core.cpu_features()["override_error"]:
    raise ValueError(f"tensorxfer: {_cpu_override_error}")

from tensorxfer.distributed import register_when_torch_distributed_is_imported as _register_backend

_register_backend()


def capabilities() -> dict:
    """What tensorxfer can do here: ``{"version", "cuda", "numa"}``.

    ``version`` and ``cuda`` are what this build compiled in. ``numa`` is whether
    the kernel answers the NUMA system calls that placement uses (``get_mempolicy``,
    ``mbind``, ``move_pages``), probed on each call: every build makes them itself
    (no libnuma), but a kernel without NUMA or a container's seccomp profile can
    refuse them. ``python -m tensorxfer info`` says which one and why.
    """
    found = dict(_core.build_info)
    found["numa"] = bool(_core.numa_supported())
    return found


__all__ = [
    "__version__",
    "capabilities",
    "ClosedError",
    "CorruptSegmentError",
    "PeerLost",
    "PeerLostError",
    "TensorxferError",
    "UnsupportedError",
]
