"""NativeBatches: a plan's batches are converted once, and again whenever they change."""

from __future__ import annotations

import numpy as np
import pytest

from tensorxfer.resharding.native_batch import NativeBatches
from tensorxfer.resharding.schedule import BatchTask, ScheduledBatch


def _batch():
    return ScheduledBatch(0, 1, 0, 0, [BatchTask(5, 0, 10, 0), BatchTask(6, 0, 20, 64)], 84)


def test_an_unchanged_batch_is_not_converted_again():
    cache, batch = NativeBatches(), _batch()
    cache.start()
    first = cache.native(batch)
    cache.start()  # the next run of the same plan
    assert cache.native(batch) is first
    assert cache.digest(batch) == cache.digest(batch)


@pytest.mark.parametrize("change", ["replace a task", "append a task", "field", "field type"])
def test_a_changed_batch_is_converted_and_checked_again(change):
    cache, batch = NativeBatches(), _batch()
    cache.start()
    first, digest = cache.native(batch), cache.digest(batch)
    if change == "replace a task":
        batch.tasks[1] = BatchTask(6, 4, 16, 64)
    elif change == "append a task":
        batch.tasks.append(BatchTask(7, 0, 1, 128))
    elif change == "field":
        batch.total_size = 90
    else:
        batch.total_size = 84.0
    cache.start()
    if change == "field type":
        with pytest.raises(ValueError, match="total_size must be an int, got float"):
            cache.native(batch)
        return
    second = cache.native(batch)
    assert second is not first and cache.digest(batch) != digest
    assert np.array_equal(second[5][:, 0], [task.task_id for task in batch.tasks])


def test_a_bad_task_is_refused_every_time_not_cached():
    cache = NativeBatches()
    batch = ScheduledBatch(0, 1, 0, 0, [BatchTask(5, -1, 10, 0)], 10)
    for _ in range(2):
        cache.start()
        with pytest.raises(ValueError, match=r"tasks\[0\].task_offset must be in"):
            cache.native(batch)
