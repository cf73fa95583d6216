"""ReplayTickMetadata: validation, immutability, trace arguments."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tensorxfer.ipc.replay_pipelines import ReplayTickMetadata
from tensorxfer.ipc.replay_pipelines.base import ReplayTickMetadata as BaseReplayTickMetadata


def test_reexported_from_package():
    assert ReplayTickMetadata is BaseReplayTickMetadata


def test_minimal_metadata_traces_slot_and_tick():
    metadata = ReplayTickMetadata(slot=1, tick_id=7)
    assert metadata.trace_args() == {"slot": 1, "tick_id": 7}
    assert metadata.rows is None and metadata.env_ids == ()


def test_full_metadata_normalizes_numpy_integers_and_env_ids():
    metadata = ReplayTickMetadata(
        slot=np.int64(2), tick_id=np.uint32(9), rows=64, producer_id=0, env_ids=np.array([3, 1]), created_ns=10**18
    )
    assert type(metadata.slot) is int and type(metadata.tick_id) is int
    assert metadata.env_ids == (3, 1) and all(type(env) is int for env in metadata.env_ids)
    assert metadata.trace_args() == {
        "slot": 2, "tick_id": 9, "rows": 64, "producer_id": 0, "created_ns": 10**18, "env_ids": [3, 1]
    }


def test_frozen_and_hashable():
    metadata = ReplayTickMetadata(slot=0, tick_id=1, env_ids=[5])
    with pytest.raises(dataclasses.FrozenInstanceError):
        metadata.tick_id = 2
    assert hash(metadata) == hash(ReplayTickMetadata(slot=0, tick_id=1, env_ids=(5,)))


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(slot=-1, tick_id=0), ValueError, r"slot must be >= 0, got -1"),
        (dict(slot=0, tick_id=-5), ValueError, r"tick_id must be >= 0, got -5"),
        (dict(slot=0.0, tick_id=0), TypeError, r"slot must be a non-negative int, got float"),
        (dict(slot=True, tick_id=0), TypeError, r"slot must be a non-negative int, got bool"),
        (dict(slot=0, tick_id="3"), TypeError, r"tick_id must be a non-negative int, got str"),
        (dict(slot=0, tick_id=0, rows=-2), ValueError, r"rows must be >= 0"),
        (dict(slot=0, tick_id=0, producer_id=1.5), TypeError, r"producer_id must be a non-negative int or None"),
        (dict(slot=0, tick_id=0, created_ns=-1), ValueError, r"created_ns must be >= 0"),
        (dict(slot=0, tick_id=0, env_ids="ab"), TypeError, r"env_ids must be an iterable of ints, got str"),
        (dict(slot=0, tick_id=0, env_ids=5), TypeError, r"env_ids must be an iterable of ints, got int"),
        (dict(slot=0, tick_id=0, env_ids=[1, -1]), ValueError, r"env_ids\[...\] must be >= 0"),
    ],
)
def test_bad_fields_are_refused_with_the_field_name(kwargs, error, message):
    with pytest.raises(error, match=message):
        ReplayTickMetadata(**kwargs)
