"""The ``"tensorxfer"`` backend for ``torch.distributed`` (CPU tensors).

Importing ``tensorxfer`` does not import torch. It registers the backend name
``"tensorxfer"`` with ``torch.distributed.Backend.register_backend`` as soon as
torch is imported (now, if it already is; else by an import hook that fires
once ``import torch``, which imports ``torch.distributed``, has finished). So a script changes only the backend name::

    import tensorxfer                      # registers "tensorxfer" (lazily)
    import torch.distributed as dist
    dist.init_process_group("tensorxfer")  # or "cpu:tensorxfer,cuda:nccl"

:func:`register` does the same explicitly; :func:`is_registered` says whether
it happened. The process group itself lives in
``tensorxfer.distributed.process_group`` (imports torch).
"""

from __future__ import annotations

import sys
import threading
from typing import Any

from tensorxfer._after_import import call_after_import, call_warning_on_failure

#: The backend's name for ``torch.distributed.init_process_group`` (``"cpu:tensorxfer,cuda:nccl"`` too).
BACKEND_NAME = "tensorxfer"
_TRIGGER_MODULE = "torch"
_lock = threading.Lock()
_registered = False


def register() -> bool:
    """Registers the ``"tensorxfer"`` backend with torch.distributed (imports it); idempotent.

    Returns False (registering nothing) when torch or torch.distributed is not
    available.
    """
    global _registered
    with _lock:
        if _registered:
            return True
        try:
            import torch.distributed as dist
        except ImportError:
            return False
        if not dist.is_available():
            return False
        # devices=["cpu"]: torch maps "cpu" to this backend only where no other
        # backend claimed it; a "cpu:tensorxfer,cuda:nccl" string names it anyway.
        if BACKEND_NAME.upper() not in dist.Backend._plugins:
            dist.Backend.register_backend(BACKEND_NAME, _create_process_group, devices=["cpu"])
        _registered = True
        return True


def _create_process_group(store: Any, rank: int, world_size: int, timeout: Any) -> Any:
    """The creator torch calls from ``init_process_group`` / ``new_group``."""
    from tensorxfer.distributed.process_group import TensorxferProcessGroup

    return TensorxferProcessGroup(store, rank, world_size, timeout)


def is_registered() -> bool:
    """True once ``"tensorxfer"`` is registered with torch.distributed (never imports torch)."""
    dist = sys.modules.get("torch.distributed")
    backend = getattr(dist, "Backend", None)
    plugins = getattr(backend, "_plugins", None)
    return bool(_registered and plugins is not None and BACKEND_NAME.upper() in plugins)


_FAILURE = "could not register the torch.distributed backend"


def register_when_torch_distributed_is_imported() -> None:
    """Registers now if torch is imported, else once it is (called by ``import tensorxfer``)."""
    if _TRIGGER_MODULE in sys.modules and "torch.distributed" in sys.modules:
        call_warning_on_failure(register, _FAILURE)  # never break `import tensorxfer`
    else:
        call_after_import(_TRIGGER_MODULE, register, _FAILURE)  # nor `import torch`


def register_from_torch_import() -> None:
    """The ``torch.backends`` entry point (pyproject.toml): torch calls it while ``import torch`` runs.

    torch.distributed is imported by then, so this registers at once. It never
    raises: torch would turn the error into a failed ``import torch``.
    """
    call_warning_on_failure(register, _FAILURE)


def __getattr__(name: str) -> Any:
    if name == "TensorxferProcessGroup":
        from tensorxfer.distributed.process_group import TensorxferProcessGroup

        return TensorxferProcessGroup
    raise AttributeError(f"module 'tensorxfer.distributed' has no attribute {name!r}")


__all__ = ["BACKEND_NAME", "TensorxferProcessGroup", "is_registered", "register", "register_from_torch_import",
           "register_when_torch_distributed_is_imported"]
