"""What a replay producer tells the learner about one packed batch."""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Optional

from tensorxfer._arguments import check_int, check_optional_int

_REQUIRED_FIELDS = ("tick_id", "snapshot_ptr", "snapshot_size", "sample_seed", "sample_count")
_OPTIONAL_FIELDS = ("batch_host_slot", "batch_gpu_slot")


def _as_index(value: Any, name: str, *, optional: bool = False) -> Optional[int]:
    """``value`` as a non-negative Python int (the package's integer rules: numpy integers accepted, bools refused)."""
    if optional:
        return check_optional_int(value, f"ReplayTickMetadata.{name}", 0)
    return check_int(value, f"ReplayTickMetadata.{name}", 0)


@dataclasses.dataclass(frozen=True)
class ReplayTickMetadata:
    """Describes the batch a replay producer packed at one learner tick.

    The upstream dataclass, field for field:

    * ``tick_id``: the tick; it must strictly increase across the submits of one
      transfer backend.
    * ``snapshot_ptr`` / ``snapshot_size``: address and size in bytes of the
      replay snapshot the rows were sampled from.
    * ``sample_seed`` / ``sample_count``: the seed of the row sampler and the
      number of rows sampled, so the batch can be recomputed.
    * ``batch_host_slot``: the host ring slot the packed batch sits in; when
      set it must equal the ``slot`` passed to ``submit_h2d``.
    * ``batch_gpu_slot``: the device slot the batch is copied into.

    Every field is a non-negative int (numpy integers are accepted and stored
    as ``int``); the two slots may be None.  All seven fields go into the trace
    span arguments of ``submit_h2d``.
    """

    tick_id: int
    snapshot_ptr: int
    snapshot_size: int
    sample_seed: int
    sample_count: int
    batch_host_slot: Optional[int] = None
    batch_gpu_slot: Optional[int] = None

    def __post_init__(self) -> None:
        for name in _REQUIRED_FIELDS:
            object.__setattr__(self, name, _as_index(getattr(self, name), name))
        for name in _OPTIONAL_FIELDS:
            object.__setattr__(self, name, _as_index(getattr(self, name), name, optional=True))

    def trace_args(self) -> Dict[str, Optional[int]]:
        """All seven fields (unset slots as None), as a flat dict for trace-span arguments."""
        return {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}


__all__ = ["ReplayTickMetadata"]
