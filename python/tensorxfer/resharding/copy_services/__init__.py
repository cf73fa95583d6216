"""Batched send/recv of many tensors by task id (``tensorxfer.resharding.copy_services``).

Every rank of the group runs::

    from tensorxfer.resharding.copy_services import build_copy_service
    with build_copy_service("torch") as service:          # or "mpi", "local"
        for task_id, tensor, peer in my_sends:
            service.submit_send(tensor, peer, task_id)
        for task_id, tensor, peer in my_recvs:
            service.submit_recv(tensor, peer, task_id)
        service.run()                                      # every rank calls it

Backends: ``LocalCopyService`` (one process), ``MpiCopyService`` (mpi4py),
``TorchDistributedCopyService`` (torch.distributed), ``ShmCopyService`` (the
ranks of one host: pipeline executor and cross-memory attach). The multi-process ones
agree on every task's byte size before any byte moves, move tasks in windows of
task-id order and pack small tensors per peer into one message.
"""

from typing import Any

from tensorxfer.resharding.copy_services.base import (
    CopyService,
    RecvOp,
    SendOp,
    TaskMismatchError,
    match_local_ops_by_task_id,
)
from tensorxfer.resharding.copy_services.factory import build_copy_service
from tensorxfer.resharding.copy_services.local import LocalCopyService


def __getattr__(name: str) -> Any:
    # The MPI and torch backends import their libraries lazily.
    if name == "MpiCopyService":
        from tensorxfer.resharding.copy_services.mpi import MpiCopyService

        return MpiCopyService
    if name == "TorchDistributedCopyService":
        from tensorxfer.resharding.copy_services.torch_distributed import TorchDistributedCopyService

        return TorchDistributedCopyService
    if name == "ShmCopyService":
        from tensorxfer.resharding.copy_services.shm import ShmCopyService

        return ShmCopyService
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "CopyService",
    "RecvOp",
    "SendOp",
    "TaskMismatchError",
    "match_local_ops_by_task_id",
    "build_copy_service",
    "LocalCopyService",
    "MpiCopyService",
    "TorchDistributedCopyService",
    "ShmCopyService",
]
