"""Resharding: move many tensors between ranks by task id.

* ``tensorxfer.resharding.schedule`` -- the transfer schedule every rank computes
  alike from all-gathered metadata (``SendRequest``, ``ReceiveRequest``,
  ``ScheduledBatch``, ``build_schedule``).
"""
