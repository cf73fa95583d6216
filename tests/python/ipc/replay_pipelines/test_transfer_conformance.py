"""The ReplayTransferBackend contract, checked on every backend this machine can build."""

from __future__ import annotations

import gc
import math
import weakref

import numpy as np
import pytest
from replay_backend_helpers import RecordingTraceRecorder, backend, case, to_numpy  # noqa: F401 (fixtures)

from tensorxfer.ipc.replay_pipelines.base import ReplayTickMetadata
from tensorxfer.ipc.replay_pipelines.transfer import ReplayTransferBackend, TraceRecorder

SHAPE = (8, 16)


def host_source(seed: int, dtype=np.float32, shape=SHAPE) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if np.dtype(dtype) == np.bool_:
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    return rng.integers(0, 1000, size=shape).astype(dtype)


def device_slot(backend, dtype=np.float32, shape=SHAPE):
    return backend.allocate_device_slots(count=1, shape=shape, dtype=dtype)[0]


# -- attributes and the protocol ---------------------------------------------------------------
def test_backend_satisfies_the_protocol_with_typed_attributes(backend, case):
    assert isinstance(backend, ReplayTransferBackend)
    torch = pytest.importorskip("torch")
    assert isinstance(backend.device, torch.device)
    assert backend.device.type == case.device
    for name in ("device_family", "h2d_submitter", "host_memory_kind"):
        assert isinstance(getattr(backend, name), str) and getattr(backend, name), name
    for name in ("host_pinned", "direct_pinned_shared", "supports_async_submit", "supports_timing_events"):
        assert isinstance(getattr(backend, name), bool), name
    assert backend.ring_depth == 4


def test_recording_recorder_satisfies_trace_recorder_protocol():
    assert isinstance(RecordingTraceRecorder(), TraceRecorder)
    assert not isinstance(object(), TraceRecorder)


# -- data correctness -------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.uint8, np.float16, np.bool_], ids=str)
def test_numpy_source_lands_in_device_slot(backend, dtype):
    src = host_source(1, dtype)
    dst = device_slot(backend, dtype)
    backend.submit_h2d(slot=0, dst=dst, src=src)
    backend.synchronize_ready(0)
    np.testing.assert_array_equal(to_numpy(dst), src)


def test_torch_source_lands_in_torch_device_slot(backend):
    torch = pytest.importorskip("torch")
    src = torch.arange(128, dtype=torch.float32).reshape(SHAPE) * 3
    dst = backend.allocate_device_slots(count=1, shape=SHAPE, dtype=torch.float32)[0]
    assert isinstance(dst, torch.Tensor)
    backend.submit_h2d(slot=1, dst=dst, src=src)
    backend.synchronize_ready(1)
    assert torch.equal(dst.cpu(), src)


def test_every_slot_keeps_its_own_batch(backend):
    sources = [host_source(seed) for seed in range(backend.ring_depth)]
    slots = backend.allocate_device_slots(count=backend.ring_depth, shape=SHAPE, dtype=np.float32)
    for slot, (dst, src) in enumerate(zip(slots, sources)):
        backend.submit_h2d(slot=slot, dst=dst, src=src)
    for slot, (dst, src) in enumerate(zip(slots, sources)):
        backend.synchronize_ready(slot)
        np.testing.assert_array_equal(to_numpy(dst), src)


def test_h2d_bytes_copies_only_that_prefix(backend):
    src = host_source(2, np.float32, (64,))
    dst = device_slot(backend, np.float32, (64,))
    backend.submit_h2d(slot=0, dst=dst, src=src, h2d_bytes=40 * 4)
    backend.synchronize_ready(0)
    out = to_numpy(dst)
    np.testing.assert_array_equal(out[:40], src[:40])
    assert not out[40:].any(), "bytes past h2d_bytes must stay untouched (allocate_device_slots zero-fills)"


def test_same_size_different_shapes_copy_bytes_in_order(backend):
    src = host_source(3, np.int64, (4, 32))
    dst = device_slot(backend, np.int64, (128,))
    backend.submit_h2d(slot=2, dst=dst, src=src)
    backend.synchronize_ready(2)
    np.testing.assert_array_equal(to_numpy(dst), src.reshape(-1))


def test_zero_byte_submit_marks_slot_and_copies_nothing(backend):
    src = host_source(4)
    dst = device_slot(backend)
    backend.submit_h2d(slot=0, dst=dst, src=src, h2d_bytes=0)
    backend.synchronize_ready(0)
    assert backend.ready_query(0)
    assert not to_numpy(dst).any()


# -- readiness ---------------------------------------------------------------------------------
def test_slots_are_ready_before_any_submit(backend):
    for slot in range(backend.ring_depth):
        assert backend.ready_query(slot) is True
        backend.synchronize_ready(slot, timeout=0.001)  # returns at once
        backend.wait_current_stream_for_ready(slot, timeout=0.001)


def test_ready_after_synchronize_and_after_clear(backend):
    src, dst = host_source(5), device_slot(backend)
    backend.submit_h2d(slot=3, dst=dst, src=src)
    backend.synchronize_ready(3)
    assert backend.ready_query(3) is True
    backend.clear_ready(3)
    assert backend.ready_query(3) is True
    backend.synchronize_ready(3, timeout=0.001)


def test_wait_current_stream_orders_reads_after_the_copy(backend):
    src, dst = host_source(6), device_slot(backend)
    backend.submit_h2d(slot=1, dst=dst, src=src)
    backend.wait_current_stream_for_ready(1)
    # Reading on the current stream (to_numpy's .cpu() / numpy copy) now sees the batch.
    np.testing.assert_array_equal(to_numpy(dst), src)


def test_submit_returns_small_positive_cpu_seconds(backend):
    src, dst = host_source(7), device_slot(backend)
    seconds = backend.submit_h2d(slot=0, dst=dst, src=src)
    assert isinstance(seconds, float)
    assert 0.0 < seconds < 1.0
    backend.synchronize_ready(0)


# -- tracing and metadata ----------------------------------------------------------------------
def tick(tick_id: int, host_slot=None, gpu_slot=None) -> ReplayTickMetadata:
    """Upstream metadata, built with exactly the upstream keywords."""
    return ReplayTickMetadata(tick_id=tick_id, snapshot_ptr=4096, snapshot_size=1 << 20, sample_seed=17,
                              sample_count=8, batch_host_slot=host_slot, batch_gpu_slot=gpu_slot)


def test_trace_slice_carries_slot_sizes_labels_and_all_metadata_fields(backend):
    recorder = RecordingTraceRecorder()
    src, dst = host_source(8), device_slot(backend)
    metadata = tick(11, host_slot=2, gpu_slot=0)
    backend.submit_h2d(
        slot=2, dst=dst, src=src, metadata=metadata, trace_recorder=recorder,
        h2d_bytes=256, pack_layout="obs+action", pack_executor="native",
    )
    backend.synchronize_ready(2)
    assert len(recorder.slices) == 1
    name, category, begin_ns, end_ns, args = recorder.slices[0]
    assert (name, category) == ("replay.h2d_submit", "replay_transfer")
    assert isinstance(begin_ns, int) and isinstance(end_ns, int) and 0 < begin_ns <= end_ns
    assert args["slot"] == 2 and args["h2d_bytes"] == 256
    assert args["pack_layout"] == "obs+action" and args["pack_executor"] == "native"
    assert args["h2d_submitter"] == backend.h2d_submitter
    assert args["pinned_memory"] is backend.host_pinned
    assert args["direct_pinned_shared"] is backend.direct_pinned_shared
    for field, value in metadata.trace_args().items():
        assert args[field] == value, field
    assert {"tick_id", "snapshot_ptr", "snapshot_size", "sample_seed", "sample_count", "batch_host_slot",
            "batch_gpu_slot"} <= set(args)
    assert recorder.pending_spans == []


def test_trace_slice_without_metadata_still_has_every_field(backend):
    recorder = RecordingTraceRecorder()
    src, dst = host_source(8), device_slot(backend)
    backend.submit_h2d(slot=1, dst=dst, src=src, trace_recorder=recorder)
    backend.synchronize_ready(1)
    args = recorder.slices[0][4]
    for field in ("tick_id", "snapshot_ptr", "snapshot_size", "sample_seed", "sample_count", "batch_host_slot",
                  "batch_gpu_slot"):
        assert field in args and args[field] is None, field


def test_trace_cuda_events_only_where_timing_events_exist(backend):
    recorder = RecordingTraceRecorder()
    src, dst = host_source(9), device_slot(backend)
    backend.submit_h2d(slot=0, dst=dst, src=src, trace_recorder=recorder, trace_cuda_events=True)
    backend.synchronize_ready(0)
    assert len(recorder.slices) == 1
    if backend.supports_timing_events:
        assert len(recorder.pending_spans) == 1
        name, category, cpu_begin_ns, start, end, args = recorder.pending_spans[0]
        assert name == "replay.h2d_copy" and cpu_begin_ns == recorder.slices[0][2]
        end.synchronize()
        assert start.elapsed_time(end) >= 0.0
    else:
        assert recorder.pending_spans == []


def test_trace_recorder_without_add_slice_is_refused_before_copying(backend):
    src, dst = host_source(10), device_slot(backend)
    with pytest.raises(TypeError, match="trace_recorder must have add_slice"):
        backend.submit_h2d(slot=0, dst=dst, src=src, trace_recorder=object())
    assert not to_numpy(dst).any()


def test_metadata_must_match_slot_and_increase(backend):
    src, dst = host_source(11), device_slot(backend)
    with pytest.raises(TypeError, match="metadata must be a ReplayTickMetadata"):
        backend.submit_h2d(slot=0, dst=dst, src=src, metadata={"tick_id": 1})
    with pytest.raises(ValueError, match=r"metadata.batch_host_slot must equal slot=1 .*got metadata.batch_host_slot=0"):
        backend.submit_h2d(slot=1, dst=dst, src=src, metadata=tick(1, host_slot=0))
    assert not to_numpy(dst).any(), "a refused submit must not copy"
    backend.submit_h2d(slot=0, dst=dst, src=src, metadata=tick(5, host_slot=0))
    for stale in (5, 4):
        with pytest.raises(ValueError, match=rf"tick_id must strictly increase per backend: got {stale} after 5"):
            backend.submit_h2d(slot=1, dst=dst, src=src, metadata=tick(stale, host_slot=1))
    backend.submit_h2d(slot=1, dst=dst, src=src, metadata=tick(6, host_slot=1))
    backend.submit_h2d(slot=3, dst=dst, src=src, metadata=tick(7))  # batch_host_slot unset: any slot
    backend.submit_h2d(slot=2, dst=dst, src=src)  # metadata is optional
    for slot in range(4):
        backend.synchronize_ready(slot)


# -- bad input ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "slot, error, message",
    [(-1, ValueError, r"slot \(ring_depth=4\): expected an integer in \[0, 3\], got -1"), (4, ValueError, "got 4"),
     (1.0, TypeError, r"slot \(ring_depth=4\): expected an integer"), (True, TypeError, "slot .*got bool"),
     ("0", TypeError, "slot .*got str")],
)
def test_slot_out_of_range_or_not_int_is_refused_by_every_method(backend, slot, error, message):
    src, dst = host_source(12), device_slot(backend)
    with pytest.raises(error, match=message):
        backend.submit_h2d(slot=slot, dst=dst, src=src)
    for method in (backend.ready_query, backend.clear_ready, backend.synchronize_ready,
                   backend.wait_current_stream_for_ready):
        with pytest.raises(error, match=message):
            method(slot)


def test_numpy_integer_slot_is_accepted(backend):
    src, dst = host_source(13), device_slot(backend)
    backend.submit_h2d(slot=np.int64(3), dst=dst, src=src)
    backend.synchronize_ready(np.int32(3))
    np.testing.assert_array_equal(to_numpy(dst), src)


def test_size_mismatch_is_refused(backend):
    dst = device_slot(backend, np.float32, (16,))
    with pytest.raises(ValueError, match=r"same size in bytes .*dst 64 bytes .*src 68 bytes"):
        backend.submit_h2d(slot=0, dst=dst, src=np.zeros(17, np.float32))


@pytest.mark.parametrize("h2d_bytes", [65, 10**9])
def test_h2d_bytes_larger_than_either_side_is_refused(backend, h2d_bytes):
    dst = device_slot(backend, np.float32, (16,))
    with pytest.raises(ValueError, match=rf"h2d_bytes must be <= the size of both dst \(64 bytes\).*got {h2d_bytes}"):
        backend.submit_h2d(slot=0, dst=dst, src=np.ones(32, np.float32), h2d_bytes=h2d_bytes)


@pytest.mark.parametrize("h2d_bytes, error", [(-1, ValueError), (2.5, TypeError), ("8", TypeError)])
def test_h2d_bytes_must_be_a_non_negative_int(backend, h2d_bytes, error):
    dst = device_slot(backend, np.float32, (16,))
    with pytest.raises(error, match="h2d_bytes"):
        backend.submit_h2d(slot=0, dst=dst, src=np.ones(16, np.float32), h2d_bytes=h2d_bytes)


def test_dtype_mismatch_is_refused(backend):
    dst = device_slot(backend, np.float32, (16,))
    with pytest.raises(TypeError, match=r"dst and src must have the same dtype, got dst .*float32.* and src .*int32"):
        backend.submit_h2d(slot=0, dst=dst, src=np.zeros(16, np.int32))


def test_non_contiguous_source_is_refused_naming_src(backend):
    dst = device_slot(backend, np.float32, (8, 8))
    src = np.zeros((8, 16), np.float32)[:, ::2]
    with pytest.raises(ValueError, match=r"src must be C-contiguous"):
        backend.submit_h2d(slot=0, dst=dst, src=src)


def test_non_contiguous_destination_is_refused_naming_dst(backend):
    dst = device_slot(backend, np.float32, (8, 8)).T
    with pytest.raises(ValueError, match=r"dst must be C-contiguous"):
        backend.submit_h2d(slot=0, dst=dst, src=np.zeros((8, 8), np.float32))


def test_read_only_numpy_destination_is_refused(backend):
    dst = np.zeros(16, np.float32)
    dst.flags.writeable = False
    with pytest.raises(ValueError, match=r"dst must be writable"):
        backend.submit_h2d(slot=0, dst=dst, src=np.ones(16, np.float32))


def test_non_tensor_inputs_are_refused(backend):
    dst = device_slot(backend, np.float32, (4,))
    with pytest.raises(TypeError, match="src"):
        backend.submit_h2d(slot=0, dst=dst, src=[1.0, 2.0, 3.0, 4.0])
    with pytest.raises(TypeError, match="dst"):
        backend.submit_h2d(slot=0, dst=object(), src=np.ones(4, np.float32))


@pytest.mark.parametrize("name, value", [("pack_layout", 3), ("pack_executor", None), ("trace_cuda_events", 1)])
def test_label_and_flag_types_are_checked(backend, name, value):
    dst = device_slot(backend, np.float32, (4,))
    with pytest.raises(TypeError, match=name):
        backend.submit_h2d(slot=0, dst=dst, src=np.ones(4, np.float32), **{name: value})


@pytest.mark.parametrize("timeout, error", [(-1.0, ValueError), (-math.inf, ValueError), (math.nan, ValueError),
                                            ("1", TypeError), (True, TypeError)])
def test_wait_timeouts_are_validated(backend, timeout, error):
    with pytest.raises(error, match="synchronize_ready: timeout"):
        backend.synchronize_ready(0, timeout=timeout)
    with pytest.raises(error, match="wait_current_stream_for_ready: timeout"):
        backend.wait_current_stream_for_ready(0, timeout=timeout)


@pytest.mark.parametrize("timeout", [None, 0, 0.0, 5, math.inf])
def test_wait_timeouts_follow_the_package_rules(backend, timeout):
    # None and +inf: no deadline; 0: check once. With nothing pending, every form returns at once.
    backend.synchronize_ready(0, timeout=timeout)
    backend.wait_current_stream_for_ready(0, timeout=timeout)
    dst = device_slot(backend, np.float32, (4,))
    backend.submit_h2d(slot=0, dst=dst, src=np.ones(4, np.float32))
    backend.synchronize_ready(0, timeout=None if timeout == 0 else timeout)
    assert backend.ready_query(0)
    backend.synchronize_ready(0, timeout=0)  # done: a single check succeeds


# -- host and device slots ---------------------------------------------------------------------
def test_register_host_slots_accepts_up_to_ring_depth(backend):
    slots = [np.zeros(4096 * 2, np.uint8) for _ in range(backend.ring_depth)]
    backend.register_host_slots(slots)
    assert isinstance(backend.host_pinned, bool)
    backend.register_host_slots(slots[:1])  # re-registration replaces the first one
    with pytest.raises(ValueError, match=r"1 to ring_depth=4 host slots, got 5"):
        backend.register_host_slots(slots + [np.zeros(8, np.uint8)])
    with pytest.raises(ValueError, match=r"got 0"):
        backend.register_host_slots([])
    with pytest.raises(TypeError, match="slots must be a list"):
        backend.register_host_slots(np.zeros(8, np.uint8).tobytes())


def test_register_host_slots_refuses_non_contiguous_slot_by_index(backend):
    good = np.zeros(64, np.float32)
    with pytest.raises(ValueError, match=r"slots\[1\] must be C-contiguous"):
        backend.register_host_slots([good, np.zeros((8, 8), np.float32)[:, ::2]])
    with pytest.raises(TypeError, match=r"slots\[0\]"):
        backend.register_host_slots([object()])


def test_registered_host_slots_still_copy_correctly(backend):
    slots = [host_source(seed) for seed in range(2)]
    backend.register_host_slots(slots)
    device_slots = backend.allocate_device_slots(count=2, shape=SHAPE, dtype=np.float32)
    for slot in range(2):
        backend.submit_h2d(slot=slot, dst=device_slots[slot], src=slots[slot])
    for slot in range(2):
        backend.synchronize_ready(slot)
        np.testing.assert_array_equal(to_numpy(device_slots[slot]), slots[slot])


def test_registration_keeps_slots_alive_only_where_pinning_needs_it(backend, case):
    slot = np.ones(1 << 16, np.uint8)
    alive = weakref.ref(slot)
    backend.register_host_slots([slot])
    del slot
    gc.collect()
    if case.name == "cuda_like" and backend.host_pinned:
        assert alive() is not None, "cudaHostRegister'ed memory must stay alive until unregistered"
    else:
        assert alive() is None, "register_host_slots must not keep the caller's slots alive"


def test_allocate_device_slots_family_follows_dtype(backend, case):
    torch = pytest.importorskip("torch")
    numpy_slots = backend.allocate_device_slots(count=3, shape=(2, 5), dtype=np.int32)
    named = backend.allocate_device_slots(count=1, shape=7, dtype="float64")
    torch_slots = backend.allocate_device_slots(count=2, shape=(4,), dtype=torch.bfloat16)
    assert len(numpy_slots) == 3 and len(torch_slots) == 2
    assert len({id(slot) for slot in numpy_slots}) == 3
    for slot in torch_slots:
        assert isinstance(slot, torch.Tensor) and slot.dtype == torch.bfloat16
        assert slot.device.type == case.device and slot.is_contiguous() and tuple(slot.shape) == (4,)
    if case.numpy_device_slots:
        assert all(isinstance(slot, np.ndarray) and slot.dtype == np.int32 for slot in numpy_slots)
        assert isinstance(named[0], np.ndarray) and named[0].dtype == np.float64 and named[0].shape == (7,)
    else:
        assert all(isinstance(slot, torch.Tensor) and slot.dtype == torch.int32 for slot in numpy_slots)
        assert named[0].dtype == torch.float64 and tuple(named[0].shape) == (7,)
    for slot in numpy_slots:
        assert tuple(slot.shape) == (2, 5) and not to_numpy(slot).any()


@pytest.mark.parametrize(
    "kwargs, error, message",
    [(dict(count=0, shape=(2,), dtype="float32"), ValueError, "count: expected an integer >= 1, got 0"),
     (dict(count=1, shape=(2, -1), dtype="float32"), ValueError, r"shape\[1\]: expected an integer >= 0, got -1"),
     (dict(count=1, shape="2", dtype="float32"), TypeError, "shape must be an int or a sequence"),
     (dict(count=1, shape=(2,), dtype="not-a-dtype"), TypeError, "dtype must be a torch.dtype"),
     (dict(count=2.0, shape=(2,), dtype="float32"), TypeError, "count: expected an integer >= 1, got float")],
)
def test_allocate_device_slots_bad_arguments(backend, kwargs, error, message):
    with pytest.raises(error, match=message):
        backend.allocate_device_slots(**kwargs)


# -- lifecycle ---------------------------------------------------------------------------------
def test_close_is_idempotent_and_every_method_then_raises(backend):
    src, dst = host_source(14), device_slot(backend)
    backend.submit_h2d(slot=0, dst=dst, src=src)
    backend.close()
    backend.close()
    assert backend.closed
    np.testing.assert_array_equal(to_numpy(dst), src)  # close waited for the copy
    calls = [
        lambda: backend.submit_h2d(slot=0, dst=dst, src=src),
        lambda: backend.register_host_slots([src]),
        lambda: backend.allocate_device_slots(count=1, shape=(1,), dtype="float32"),
        lambda: backend.clear_ready(0),
        lambda: backend.ready_query(0),
        lambda: backend.synchronize_ready(0),
        lambda: backend.wait_current_stream_for_ready(0),
    ]
    for call in calls:
        with pytest.raises(ValueError, match=f"{type(backend).__name__} is closed"):
            call()
    with pytest.raises(ValueError, match="is closed"):
        backend.__enter__()


def test_context_manager_closes(case):
    with case.build(2) as backend:
        src, dst = host_source(15), device_slot(backend)
        backend.submit_h2d(slot=1, dst=dst, src=src)
    assert backend.closed
    np.testing.assert_array_equal(to_numpy(dst), src)


def test_dropping_an_open_backend_with_pending_copies_is_safe(case):
    src = host_source(16, np.float32, (1 << 16,))
    backend = case.build(2)
    dst = device_slot(backend, np.float32, (1 << 16,))
    backend.register_host_slots([src])
    backend.submit_h2d(slot=0, dst=dst, src=src)
    del backend
    gc.collect()
    np.testing.assert_array_equal(to_numpy(dst), src)  # __del__ closed it after the copy finished


@pytest.mark.parametrize("ring_depth, error", [(0, ValueError), (-3, ValueError), (2.0, TypeError),
                                               (True, TypeError), (None, TypeError)])
def test_ring_depth_is_validated(case, ring_depth, error):
    with pytest.raises(error, match="ring_depth"):
        case.build(ring_depth)
