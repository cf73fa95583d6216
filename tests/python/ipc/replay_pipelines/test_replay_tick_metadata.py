"""ReplayTickMetadata: the upstream dataclass, field for field; validation, immutability, trace arguments."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tensorxfer.ipc.replay_pipelines import ReplayTickMetadata
from tensorxfer.ipc.replay_pipelines.base import ReplayTickMetadata as BaseReplayTickMetadata

UPSTREAM_FIELDS = [
    ("tick_id", int, dataclasses.MISSING),
    ("snapshot_ptr", int, dataclasses.MISSING),
    ("snapshot_size", int, dataclasses.MISSING),
    ("sample_seed", int, dataclasses.MISSING),
    ("sample_count", int, dataclasses.MISSING),
    ("batch_host_slot", "int | None", None),
    ("batch_gpu_slot", "int | None", None),
]


def upstream_metadata(**overrides):
    fields = dict(tick_id=3, snapshot_ptr=0x7F00_0000_1000, snapshot_size=1 << 30, sample_seed=1234,
                  sample_count=256, batch_host_slot=1, batch_gpu_slot=0)
    fields.update(overrides)
    return ReplayTickMetadata(**fields)


def test_reexported_from_package():
    assert ReplayTickMetadata is BaseReplayTickMetadata


def test_a_script_written_against_upstream_constructs_it_by_keyword():
    metadata = ReplayTickMetadata(
        tick_id=12, snapshot_ptr=140_000_000_000, snapshot_size=4096, sample_seed=99, sample_count=64,
        batch_host_slot=2, batch_gpu_slot=1,
    )
    assert (metadata.tick_id, metadata.snapshot_ptr, metadata.snapshot_size) == (12, 140_000_000_000, 4096)
    assert (metadata.sample_seed, metadata.sample_count) == (99, 64)
    assert (metadata.batch_host_slot, metadata.batch_gpu_slot) == (2, 1)


def test_fields_names_order_and_defaults_are_upstreams():
    fields = dataclasses.fields(ReplayTickMetadata)
    assert [field.name for field in fields] == [name for name, _, _ in UPSTREAM_FIELDS]
    for field, (name, _annotation, default) in zip(fields, UPSTREAM_FIELDS):
        assert field.default is default, name
    assert ReplayTickMetadata.__dataclass_params__.frozen


def test_positional_construction_follows_upstream_order():
    metadata = ReplayTickMetadata(1, 2, 3, 4, 5)
    assert dataclasses.astuple(metadata) == (1, 2, 3, 4, 5, None, None)


def test_trace_args_carry_all_seven_fields():
    metadata = upstream_metadata()
    assert metadata.trace_args() == {
        "tick_id": 3, "snapshot_ptr": 0x7F00_0000_1000, "snapshot_size": 1 << 30, "sample_seed": 1234,
        "sample_count": 256, "batch_host_slot": 1, "batch_gpu_slot": 0,
    }
    unset = ReplayTickMetadata(tick_id=0, snapshot_ptr=0, snapshot_size=0, sample_seed=0, sample_count=0)
    assert unset.trace_args()["batch_host_slot"] is None and unset.trace_args()["batch_gpu_slot"] is None
    assert len(unset.trace_args()) == 7


def test_numpy_integers_are_stored_as_int():
    metadata = upstream_metadata(tick_id=np.uint32(9), snapshot_ptr=np.uint64(2**63), sample_seed=np.int64(5),
                                 batch_host_slot=np.int16(3))
    for name in ("tick_id", "snapshot_ptr", "sample_seed", "batch_host_slot"):
        assert type(getattr(metadata, name)) is int, name
    assert metadata.snapshot_ptr == 2**63


def test_frozen_and_hashable():
    metadata = upstream_metadata()
    with pytest.raises(dataclasses.FrozenInstanceError):
        metadata.tick_id = 2
    assert hash(metadata) == hash(upstream_metadata())
    assert metadata != upstream_metadata(batch_gpu_slot=None)


def test_the_old_field_names_are_gone():
    with pytest.raises(TypeError, match="slot"):
        ReplayTickMetadata(slot=1, tick_id=7)


@pytest.mark.parametrize(
    "overrides, error, message",
    [
        (dict(tick_id=-5), ValueError, r"ReplayTickMetadata.tick_id: expected an integer >= 0, got -5"),
        (dict(snapshot_ptr=-1), ValueError, r"snapshot_ptr: expected an integer >= 0, got -1"),
        (dict(snapshot_size=1.5), TypeError, r"snapshot_size: expected an integer >= 0, got float"),
        (dict(sample_seed=True), TypeError, r"sample_seed: expected an integer >= 0, got bool"),
        (dict(sample_count="3"), TypeError, r"sample_count: expected an integer >= 0, got str"),
        (dict(sample_count=None), TypeError, r"sample_count: expected an integer >= 0, got NoneType"),
        (dict(batch_host_slot=-2), ValueError, r"batch_host_slot: expected an integer >= 0, got -2 \(or None\)"),
        (dict(batch_gpu_slot=0.0), TypeError, r"batch_gpu_slot: expected an integer >= 0, got float \(or None\)"),
    ],
)
def test_bad_fields_are_refused_with_the_field_name(overrides, error, message):
    with pytest.raises(error, match=message):
        upstream_metadata(**overrides)
