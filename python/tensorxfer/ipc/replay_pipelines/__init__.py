"""Replay pipelines: collectors pack batches into shared host slots, a learner moves them to its device.

* ``tensorxfer.ipc.replay_pipelines.base`` -- ``ReplayTickMetadata``, what a
  producer says about one packed batch.
* ``tensorxfer.ipc.replay_pipelines.transfer`` -- the host-to-device transfer
  backends and ``build_replay_transfer_backend``.
"""

from tensorxfer.ipc.replay_pipelines.base import ReplayTickMetadata

__all__ = ["ReplayTickMetadata"]
