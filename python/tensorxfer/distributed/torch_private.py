"""The private torch.distributed names the backend needs, imported here and nowhere else.

``torch.distributed`` exports every other name the backend uses (``PrefixStore``,
``ProcessGroupGloo``, ``ReduceOp`` and the options of each op), but not
``AllgatherOptions``, the options of ``ProcessGroup.allgather`` and
``_allgather_base``: it lives in the C extension only. Tested with torch 2.13.
"""

from torch._C._distributed_c10d import AllgatherOptions

__all__ = ["AllgatherOptions"]
