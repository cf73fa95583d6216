"""``build_copy_service``: a copy service by backend name."""

from __future__ import annotations

import importlib
from typing import Any, Dict, Tuple

from tensorxfer.resharding.copy_services.base import CopyService

#: name -> (module, class), each class built as ``cls(group, **options)``. A new backend is one entry here.
BACKENDS: Dict[str, Tuple[str, str]] = {
    "local": ("tensorxfer.resharding.copy_services.local", "LocalCopyService"),
    "mpi": ("tensorxfer.resharding.copy_services.mpi", "MpiCopyService"),
    "torch": ("tensorxfer.resharding.copy_services.torch_distributed", "TorchDistributedCopyService"),
    "shm": ("tensorxfer.resharding.copy_services.shm", "ShmCopyService"),
}


def build_copy_service(backend: str, group: Any = None, **options: Any) -> CopyService:
    """A copy service of the named backend: ``"local"``, ``"mpi"``, ``"torch"`` or ``"shm"``.

    Args:
        backend: the backend's name (a key of
            :data:`~tensorxfer.resharding.copy_services.factory.BACKENDS`).
        group: ``None`` means: for ``"torch"`` and ``"shm"`` the default torch.distributed
            group (``"shm"`` also takes a LocalGroup or an mpi4py communicator of one
            host's ranks), for ``"mpi"`` ``MPI.COMM_WORLD`` (else pass an mpi4py
            communicator), for ``"local"`` a single process.
        **options: go to the backend's constructor (e.g. ``timeout``).

    Returns:
        The backend's service, built as ``cls(group, **options)``.

    Raises:
        ValueError: an unknown name (the message names the known backends).
        TypeError: ``backend`` is not a str.
    """
    if not isinstance(backend, str):
        raise TypeError(f"backend: expected a name (str), got {type(backend).__name__}")
    entry = BACKENDS.get(backend.lower())
    if entry is None:
        raise ValueError(f"backend: expected one of {sorted(BACKENDS)}, got {backend!r}")
    module_name, class_name = entry
    return getattr(importlib.import_module(module_name), class_name)(group, **options)

__all__ = ["BACKENDS", "build_copy_service"]
