"""What a replay producer tells the learner about one packed batch."""

from __future__ import annotations

import dataclasses
import numbers
from typing import Any, Optional, Tuple


def _as_index(value: Any, name: str, *, optional: bool = False) -> Optional[int]:
    """``value`` as a non-negative Python int (numpy integers accepted); bools are refused."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        expected = "a non-negative int or None" if optional else "a non-negative int"
        raise TypeError(f"ReplayTickMetadata.{name} must be {expected}, got {type(value).__name__} {value!r}")
    if value < 0:
        raise ValueError(f"ReplayTickMetadata.{name} must be >= 0, got {value}")
    return int(value)


@dataclasses.dataclass(frozen=True)
class ReplayTickMetadata:
    """Describes the batch in one host slot at one learner tick.

    ``slot`` is the ring slot the batch sits in and must equal the ``slot``
    passed to ``submit_h2d``; ``tick_id`` identifies the tick and must strictly
    increase across the submits of one backend.  The optional fields are carried
    into trace spans: ``rows`` (rows in the batch), ``producer_id`` (the
    collector that packed it), ``env_ids`` (environments the rows came from) and
    ``created_ns`` (``time.monotonic_ns()`` when the batch was packed, a clock
    shared by every process on the machine).
    """

    slot: int
    tick_id: int
    rows: Optional[int] = None
    producer_id: Optional[int] = None
    env_ids: Tuple[int, ...] = ()
    created_ns: Optional[int] = None

    def __post_init__(self) -> None:
        for name in ("slot", "tick_id"):
            object.__setattr__(self, name, _as_index(getattr(self, name), name))
        for name in ("rows", "producer_id", "created_ns"):
            object.__setattr__(self, name, _as_index(getattr(self, name), name, optional=True))
        if isinstance(self.env_ids, (str, bytes)) or not hasattr(self.env_ids, "__iter__"):
            raise TypeError(
                f"ReplayTickMetadata.env_ids must be an iterable of ints, got {type(self.env_ids).__name__}"
            )
        env_ids = tuple(_as_index(env_id, "env_ids[...]") for env_id in self.env_ids)
        object.__setattr__(self, "env_ids", env_ids)

    def trace_args(self) -> dict:
        """The fields that are set, as a flat dict for trace-span arguments."""
        args = {"slot": self.slot, "tick_id": self.tick_id}
        for name in ("rows", "producer_id", "created_ns"):
            value = getattr(self, name)
            if value is not None:
                args[name] = value
        if self.env_ids:
            args["env_ids"] = list(self.env_ids)
        return args


__all__ = ["ReplayTickMetadata"]
