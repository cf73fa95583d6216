"""Resharding: move many tensors between ranks by task id.

* ``tensorxfer.resharding.schedule`` -- the transfer schedule every rank computes
  alike from all-gathered metadata (``SendRequest``, ``ReceiveRequest``,
  ``ScheduledBatch``, ``build_schedule``).
* ``tensorxfer.resharding.copy_services`` -- batched send/receive services
  matched by task id (``build_copy_service("local" | "mpi" | "torch")``):
  windows in task-id order, small tensors packed per peer, byte sizes agreed
  before any byte moves.
"""
