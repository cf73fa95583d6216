"""What the executors' native side reads: requests as task memory rows, and schedule
batches, each checked once per batch object.

``execute_pipeline`` takes ``ScheduledBatch`` objects. Converting one means
checking every field of every ``BatchTask`` in Python (a ValueError naming the
field), which for 10,000 tasks costs about 100 ms: more than moving them. A plan
is usually run again and again, so :class:`NativeBatches` keeps the last plan's
conversions with the objects they came from, and converts a batch again only when
its fields or its task objects changed (``BatchTask`` is frozen, so the same
task objects hold the same values).
"""

from __future__ import annotations

import hashlib
import operator
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import numpy as np

from tensorxfer.resharding.schedule import BatchTask, ScheduledBatch

#: The request fields that hold each side's tensor and the task's byte position in it.
_REQUEST_FIELDS = {"send": ("src_tensor", "src_pos"), "receive": ("dest_tensor", "dest_pos")}


def task_rows(requests: Sequence[Any], side: str, locate: Callable[[Any, str, bool], Tuple[int, int]]) -> np.ndarray:
    """(n, 3) uint64 rows (task_id, address, size) of ``side``'s ("send" or "receive")
    requests. ``locate(tensor, where, writable)`` gives a tensor's (address, nbytes), or
    raises ValueError when the executor cannot use it (``writable``: the side receives);
    a task outside its tensor is a ValueError."""
    tensor_field, position_field = _REQUEST_FIELDS[side]
    rows = np.zeros((len(requests), 3), np.uint64)
    for i, request in enumerate(requests):
        where = f"{side} task {request.task_id}"
        address, nbytes = locate(getattr(request, tensor_field), where, side == "receive")
        position, size = int(getattr(request, position_field)), int(request.size)
        if position < 0 or size < 0 or position + size > nbytes:
            raise ValueError(f"{where}: bytes [{position}, {position + size}) do not lie in its tensor of "
                             f"{nbytes} bytes")
        rows[i] = (request.task_id, address + position, size)
    return rows


#: Exclusive upper bounds of the native fields.
U32 = 1 << 32
U64 = 1 << 64


def field_int(value: Any, name: str, where: str, high: int) -> int:
    """``value`` as an int in [0, high), or ValueError naming the field."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{where}: {name} must be an int, got {type(value).__name__} {value!r}")
    if not 0 <= int(value) < high:
        raise ValueError(f"{where}: {name} must be in [0, {high}), got {int(value)}")
    return int(value)


def native_batch(batch: ScheduledBatch, where: str = "batch") -> tuple:
    """The native form of ``batch``, its fields checked (ValueError naming the field). The ranges
    that depend on the group and the slots are checked natively, also before anything moves."""
    if not isinstance(batch, ScheduledBatch):
        raise ValueError(f"{where}: expected a ScheduledBatch or None, got {type(batch).__name__}")
    src = field_int(batch.src_pe, "src_pe", where, 1 << 31)
    dest = field_int(batch.dest_pe, "dest_pe", where, 1 << 31)
    index = field_int(batch.batch_index, "batch_index", where, U32)
    iteration = field_int(batch.iteration, "iteration", where, U32)
    total = field_int(batch.total_size, "total_size", where, U64)
    rows = []
    for k, task in enumerate(batch.tasks):
        if not isinstance(task, BatchTask):
            raise ValueError(f"{where}: tasks[{k}] must be a BatchTask, got {type(task).__name__}")
        rows.append(tuple(field_int(getattr(task, name), f"tasks[{k}].{name}", where, U64)
                          for name in ("task_id", "task_offset", "size", "slot_offset")))
    segments = np.array(rows, np.uint64).reshape(-1, 4)
    return (src, dest, index, iteration, total, segments)


@dataclass
class _Converted:
    """One batch's conversion, with what it was converted from. Holding the batch and its
    tasks keeps their ids from being reused by other objects."""

    batch: ScheduledBatch
    fields: Tuple[Any, ...]  # _fields(batch) then
    tasks: tuple  # batch.tasks then
    native: tuple  # native_batch(batch)
    digest: Optional[str] = None  # made on first use


class NativeBatches:
    """The native form and digest of each batch seen since :meth:`start` and in the run before."""

    def __init__(self) -> None:
        self._previous: Dict[int, _Converted] = {}
        self._current: Dict[int, _Converted] = {}

    def start(self) -> None:
        """A new plan begins: batches of the last one stay reusable, older ones are dropped."""
        self._previous, self._current = self._current, {}

    def native(self, batch: ScheduledBatch, where: str = "batch") -> tuple:
        """native_batch(batch, where), reused while the batch is unchanged."""
        return self._entry(batch, where).native

    def digest(self, batch: ScheduledBatch) -> str:
        """A digest of the native form (what the sender and receiver of a batch compare)."""
        entry = self._entry(batch, "batch")
        if entry.digest is None:
            native = entry.native
            entry.digest = hashlib.blake2b(repr(native[:5]).encode() + native[5].tobytes(), digest_size=12).hexdigest()
        return entry.digest

    def _entry(self, batch: ScheduledBatch, where: str) -> _Converted:
        key = id(batch)
        fields = _fields(batch)
        for table in (self._current, self._previous):
            entry = table.get(key)
            if (entry is not None and entry.batch is batch and entry.fields == fields
                    and _same_objects(batch, entry.tasks)):
                self._current[key] = entry
                return entry
        entry = _Converted(batch, fields, tuple(batch.tasks), native_batch(batch, where))
        self._current[key] = entry
        return entry


def _fields(batch: Any) -> Tuple[Any, ...]:
    values = (batch.src_pe, batch.dest_pe, batch.batch_index, batch.iteration, batch.total_size)
    return values + tuple(map(type, values))


def _same_objects(batch: Any, tasks: tuple) -> bool:
    current = batch.tasks
    return len(current) == len(tasks) and all(map(operator.is_, current, tasks))
