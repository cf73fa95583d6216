"""Resharding: move many tensors between ranks in one step.

``tensorxfer.resharding.copy_services`` holds the batched send/receive
services (``local``, ``mpi``, ``torch``), matched by task id.
"""

from tensorxfer.resharding import copy_services

__all__ = ["copy_services"]
