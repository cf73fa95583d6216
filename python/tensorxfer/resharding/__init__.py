"""Resharding: move many tensors between ranks by task id.

* ``tensorxfer.resharding.schedule`` -- the transfer schedule every rank computes
  alike from all-gathered metadata (``SendRequest``, ``ReceiveRequest``,
  ``ScheduledBatch``, ``build_schedule``).
* ``tensorxfer.resharding.copy_services`` -- batched send/receive services
  matched by task id (``build_copy_service("local" | "mpi" | "torch" | "shm")``):
  windows in task-id order, small tensors packed per peer, byte sizes agreed
  before any byte moves.
* ``tensorxfer.resharding.pipeline_executor`` -- ``PipelineExecutor``,
  ``DoubleBufferManager``, ``HostKernelLauncher``: the double-buffered
  pack/send/unpack pipeline behind the ``shm`` service.
"""
