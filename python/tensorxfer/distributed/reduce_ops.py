"""torch's reduce ops by the name the shared-memory Communicator gives them (its ``op`` argument)."""

import torch.distributed as dist

#: The reduce ops Communicator runs; the cross-host transports run all but ``avg``.
REDUCE_OPS = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG, "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}

__all__ = ["REDUCE_OPS"]
