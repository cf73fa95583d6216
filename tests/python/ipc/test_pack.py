"""PackLayout / pack_rows: layout, gather correctness, bad inputs, numpy and torch."""

from __future__ import annotations

import multiprocessing
import pickle

import numpy as np
import pytest

from tensorxfer import _core
from tensorxfer.ipc.pack import PackLayout, default_copy_engine, pack_rows

from conftest import torch_or_skip

FIELDS = {"obs": ("float32", (64,)), "action": ("float32", (8,)), "reward": ("float32", ())}


def make_store(n: int = 100, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {
        "obs": rng.standard_normal((n, 64), dtype=np.float32),
        "action": rng.standard_normal((n, 8), dtype=np.float32),
        "reward": rng.standard_normal(n, dtype=np.float32),
    }


def test_layout_offsets_are_64_byte_aligned_in_field_order():
    layout = PackLayout(FIELDS, rows=5)
    assert layout.rows == 5
    assert list(layout.fields) == ["obs", "action", "reward"]
    assert layout.fields["obs"] == ("float32", (64,))
    assert layout.fields["reward"] == ("float32", ())
    assert layout.offsets == {"obs": 0, "action": 1280, "reward": 1472}
    assert layout.row_nbytes == {"obs": 256, "action": 32, "reward": 4}
    assert layout.nbytes == 1536  # 1472 + 20 rounded up to 64
    assert all(offset % 64 == 0 for offset in layout.offsets.values())


def test_layout_accepts_numpy_and_torch_dtypes_and_int_shapes():
    torch = torch_or_skip()
    layout = PackLayout(
        {"a": (np.float16, 3), "b": (np.dtype("int64"), [2, 2]), "c": (torch.bfloat16, ()), "d": (bool, (1,))},
        rows=2,
    )
    assert layout.fields == {
        "a": ("float16", (3,)),
        "b": ("int64", (2, 2)),
        "c": ("bfloat16", ()),
        "d": ("bool", (1,)),
    }


@pytest.mark.parametrize(
    "fields, rows, error, match",
    [
        ({}, 4, ValueError, "at least one field"),
        ({"a": ("float32", ())}, -1, ValueError, "rows must be >= 0"),
        ({"a": ("float32", (-2,))}, 4, ValueError, "'a' has a negative extent"),
        ({"a": ("no_such_dtype", ())}, 4, TypeError, "'a'"),
        ({"a": ("object", ())}, 4, TypeError, "unknown dtype 'object'"),
        ({"a": "float32"}, 4, TypeError, r"field 'a': expected \(dtype, row_shape\)"),
        ({"a": (None, ())}, 4, TypeError, "got None"),
        ({"a": ("float32", "x")}, 4, TypeError, "field 'a': expected a row shape"),
        ({"a": ("float32", (2.5,))}, 4, TypeError, "field 'a': expected a row shape"),
        ({"a": ("float32", ())}, 4.5, TypeError, "rows: expected an integer"),
        # Sizes that would wrap: 2**62 elements x 4 bytes, 4 x (2**63 - 1) bytes, > 2**63 elements.
        ({"a": ("float32", (2**62,))}, 1, ValueError, r"field 'a' row bytes: .* overflows"),
        ({"a": ("float32", ())}, 2**63 - 1, ValueError, r"field 'a' row bytes \* rows: .* overflows"),
        ({"a": ("uint8", (2**32, 2**32))}, 1, ValueError, "field 'a' row shape: the shape has more than"),
        ({"a": ("uint8", (2,))}, 2**63 - 1, ValueError, "total bytes: .* overflows"),
    ],
)
def test_layout_refuses_bad_specs(fields, rows, error, match):
    with pytest.raises(error, match=match):
        PackLayout(fields, rows=rows)


def test_layout_pickles_and_compares():
    layout = PackLayout(FIELDS, rows=7)
    again = pickle.loads(pickle.dumps(layout))
    assert again == layout and hash(again) == hash(layout)
    assert again.offsets == layout.offsets and again.nbytes == layout.nbytes
    assert PackLayout(FIELDS, rows=8) != layout
    assert "rows=7" in repr(layout)


@pytest.mark.parametrize("index_dtype", [np.int64, np.int32, np.uint16])
@pytest.mark.parametrize("with_engine", [True, False])
def test_pack_rows_gathers_like_numpy_take(index_dtype, with_engine):
    store = make_store(100)
    idx = np.random.default_rng(1).integers(0, 100, 33).astype(index_dtype)
    idx[0], idx[-1] = 0, 99
    layout = PackLayout(FIELDS, rows=33)
    dst = np.full(layout.nbytes, 0xEE, np.uint8)
    engine = _core.CopyEngine(2) if with_engine else None
    pack_rows(dst, layout, sources=store, indices=idx, engine=engine)
    fields = layout.unpack(dst)
    for name, source in store.items():
        assert fields[name].shape == (33,) + source.shape[1:]
        assert fields[name].dtype == np.float32
        np.testing.assert_array_equal(fields[name], source[idx.astype(np.int64)])


def test_pack_rows_large_batch_matches_reference():
    # Large enough to cross the streaming-store threshold and split across threads.
    store = {"x": np.arange(3000 * 1024, dtype=np.float32).reshape(3000, 1024)}
    layout = PackLayout({"x": ("float32", (1024,))}, rows=2048)
    idx = np.random.default_rng(2).integers(0, 3000, 2048)
    dst = np.empty(layout.nbytes // 4, np.float32)  # any dtype is used as bytes
    pack_rows(dst, layout, store, idx)
    np.testing.assert_array_equal(layout.unpack(dst)["x"], store["x"][idx])


def test_indices_from_any_container_and_empty_batch():
    store = make_store(10)
    layout = PackLayout(FIELDS, rows=3)
    dst = np.zeros(layout.nbytes, np.uint8)
    pack_rows(dst, layout, store, [9, 0, 4])
    np.testing.assert_array_equal(layout.unpack(dst)["obs"], store["obs"][[9, 0, 4]])
    pack_rows(dst, layout, store, (1, 2, 3))
    np.testing.assert_array_equal(layout.unpack(dst)["reward"], store["reward"][[1, 2, 3]])
    empty = PackLayout(FIELDS, rows=0)
    pack_rows(np.zeros(64, np.uint8), empty, store, [])
    assert empty.unpack(np.zeros(64, np.uint8))["obs"].shape == (0, 64)


@pytest.mark.parametrize("bad", [-1, 100, 2**40])
def test_out_of_range_index_leaves_dst_untouched(bad):
    store = make_store(100)
    layout = PackLayout(FIELDS, rows=4)
    dst = np.full(layout.nbytes, 0xAB, np.uint8)
    with pytest.raises(ValueError, match=rf"indices\[3\] = {bad} is out of range for sources\['\w+'\] with 100 rows"):
        pack_rows(dst, layout, store, np.array([0, 1, 2, bad], np.int64))
    assert (dst == 0xAB).all()


def test_index_range_is_checked_against_the_smallest_source():
    store = make_store(100)
    store["reward"] = store["reward"][:50]
    layout = PackLayout(FIELDS, rows=2)
    dst = np.full(layout.nbytes, 0xAB, np.uint8)
    with pytest.raises(ValueError, match=r"sources\['reward'\] with 50 rows"):
        pack_rows(dst, layout, store, [1, 70])
    assert (dst == 0xAB).all()


def test_bad_inputs_are_refused_naming_the_field():
    store = make_store(20)
    layout = PackLayout(FIELDS, rows=2)
    dst = np.zeros(layout.nbytes, np.uint8)
    with pytest.raises(ValueError, match=r"missing fields \['reward'\]"):
        pack_rows(dst, layout, {k: v for k, v in store.items() if k != "reward"}, [0, 1])
    with pytest.raises(ValueError, match=r"unexpected fields \['extra'\]"):
        pack_rows(dst, layout, {**store, "extra": store["reward"]}, [0, 1])
    with pytest.raises(TypeError, match=r"sources\['obs'\]: expected dtype float32, got float64"):
        pack_rows(dst, layout, {**store, "obs": store["obs"].astype(np.float64)}, [0, 1])
    with pytest.raises(ValueError, match=r"sources\['action'\]: expected shape \(N, \*\(8,\)\), got \(20, 9\)"):
        pack_rows(dst, layout, {**store, "action": np.zeros((20, 9), np.float32)}, [0, 1])
    with pytest.raises(ValueError, match=r"sources\['obs'\] must be C-contiguous"):
        pack_rows(dst, layout, {**store, "obs": np.zeros((64, 20), np.float32).T}, [0, 1])
    with pytest.raises(ValueError, match="at least layout.nbytes"):
        pack_rows(np.zeros(layout.nbytes - 1, np.uint8), layout, store, [0, 1])
    readonly = np.zeros(layout.nbytes, np.uint8)
    readonly.flags.writeable = False
    with pytest.raises(ValueError, match="dst must be writable"):
        pack_rows(readonly, layout, store, [0, 1])
    with pytest.raises(TypeError, match="indices: expected integers"):
        pack_rows(dst, layout, store, [0.0, 1.0])
    with pytest.raises(ValueError, match=r"indices: expected shape \(2,\)"):
        pack_rows(dst, layout, store, [0, 1, 2])
    with pytest.raises(TypeError, match="layout"):
        pack_rows(dst, FIELDS, store, [0, 1])
    with pytest.raises(TypeError, match="engine"):
        pack_rows(dst, layout, store, [0, 1], engine="fast")
    assert not dst.any()


def test_indices_or_sources_overlapping_dst_are_refused():
    store = make_store(20)
    layout = PackLayout(FIELDS, rows=2)
    dst = np.zeros(layout.nbytes, np.uint8)
    # The indices live in the bytes the pack would overwrite.
    inside = dst[layout.offsets["reward"] : layout.offsets["reward"] + 16].view(np.int64)
    inside[:] = [3, 4]
    with pytest.raises(ValueError, match="indices overlap dst"):
        pack_rows(dst, layout, store, inside)
    assert list(inside) == [3, 4] and not dst[: layout.offsets["reward"]].any()
    aliased = np.zeros(layout.nbytes, np.uint8)
    with pytest.raises(ValueError, match=r"dst overlaps sources\['reward'\]"):
        pack_rows(aliased, layout, {**store, "reward": aliased[:80].view(np.float32)}, [0, 1])


class _DlpackOnly:
    """Exposes an array through __dlpack__ alone (no buffer protocol)."""

    def __init__(self, array):
        self.array = array

    def __dlpack__(self, **kwargs):
        return self.array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()


def test_read_only_dlpack_producer_is_never_written():
    store = make_store(20)
    layout = PackLayout(FIELDS, rows=2)
    frozen = np.zeros(layout.nbytes, np.uint8)
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="dst must be writable, got a read-only"):
        pack_rows(_DlpackOnly(frozen), layout, store, [0, 1])
    assert not frozen.any()
    # A read-only source is fine: it is only read.
    reward = store["reward"].copy()
    reward.flags.writeable = False
    dst = np.zeros(layout.nbytes, np.uint8)
    pack_rows(dst, layout, {**store, "reward": _DlpackOnly(reward)}, [4, 2])
    np.testing.assert_array_equal(layout.unpack(dst)["reward"], reward[[4, 2]])


def test_torch_sources_indices_and_dst():
    torch = torch_or_skip()
    store = {name: torch.from_numpy(array.copy()) for name, array in make_store(50).items()}
    store["obs"].requires_grad_(True)
    layout = PackLayout({"obs": (torch.float32, (64,)), "action": ("float32", (8,)), "reward": (np.float32, ())}, rows=6)
    dst = torch.zeros(layout.nbytes, dtype=torch.uint8)
    idx = torch.tensor([5, 4, 49, 0, 7, 7], dtype=torch.int32)
    pack_rows(dst, layout, store, idx)
    fields = layout.unpack(dst)
    assert all(isinstance(view, torch.Tensor) for view in fields.values())
    for name in store:
        torch.testing.assert_close(fields[name], store[name].detach()[idx.long()])
    # The views share dst's memory.
    fields["reward"][0] = 123.0
    assert layout.unpack(dst)["reward"][0].item() == 123.0
    with pytest.raises(TypeError, match="indices: expected integers"):
        pack_rows(dst, layout, store, torch.tensor([0.0] * 6))
    pack_rows(dst, layout, store, torch.tensor([1] * 6, dtype=torch.int16))
    torch.testing.assert_close(layout.unpack(dst)["action"], store["action"][[1] * 6])


def test_unpack_views_share_memory_and_validate_dst():
    layout = PackLayout(FIELDS, rows=3)
    dst = np.zeros(layout.nbytes, np.uint8)
    fields = layout.unpack(dst)
    fields["action"][2, 7] = 5.5
    offset = layout.offsets["action"] + (2 * 8 + 7) * 4
    assert dst[offset : offset + 4].view(np.float32)[0] == 5.5
    assert np.shares_memory(fields["obs"], dst)
    buffer = bytearray(layout.nbytes)
    layout.unpack(buffer)["reward"][:] = 1.0
    assert np.frombuffer(buffer, np.uint8).any()
    with pytest.raises(ValueError, match="at least layout.nbytes"):
        layout.unpack(np.zeros(layout.nbytes - 64, np.uint8))
    with pytest.raises(ValueError, match="contiguous"):
        layout.unpack(np.zeros((layout.nbytes, 2), np.uint8)[:, 0])


def test_unpack_bfloat16_needs_torch():
    torch = torch_or_skip()
    layout = PackLayout({"h": ("bfloat16", (2,))}, rows=2)
    with pytest.raises(TypeError, match="bfloat16"):
        layout.unpack(np.zeros(layout.nbytes, np.uint8))
    view = layout.unpack(torch.zeros(layout.nbytes, dtype=torch.uint8))["h"]
    assert view.dtype == torch.bfloat16 and view.shape == (2, 2)


def test_default_engine_is_created_once_per_process():
    engine = default_copy_engine()
    assert engine is default_copy_engine()
    assert engine.num_threads >= 1


def test_default_engines_are_one_per_poll_setting_and_resharding_takes_the_sleeping_one():
    from tensorxfer.resharding._copy_engine import resharding_copy_engine

    polling, sleeping = default_copy_engine(), default_copy_engine(idle_spin_us=0)
    assert polling is not sleeping
    assert sleeping is default_copy_engine(idle_spin_us=0)
    assert (polling.idle_spin_us, sleeping.idle_spin_us) == (50, 0)
    assert resharding_copy_engine() is sleeping


def _pack_in_child(queue):
    store = make_store(30, seed=3)
    layout = PackLayout(FIELDS, rows=4)
    dst = np.zeros(layout.nbytes, np.uint8)
    pack_rows(dst, layout, store, [3, 1, 29, 0])
    copied = np.zeros_like(dst)
    default_copy_engine(idle_spin_us=0).copy(copied, dst)
    queue.put(bool(np.array_equal(layout.unpack(dst)["obs"], store["obs"][[3, 1, 29, 0]]))
              and bool(np.array_equal(copied, dst)))


@pytest.mark.multiprocess
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_pack_rows_in_child_processes(method):
    default_copy_engine()  # a forked child inherits these engines without their threads
    default_copy_engine(idle_spin_us=0)
    context = multiprocessing.get_context(method)
    queue = context.Queue()
    child = context.Process(target=_pack_in_child, args=(queue,))
    child.start()
    try:
        assert queue.get(timeout=60) is True
    finally:
        child.join(timeout=60)
    assert child.exitcode == 0


def test_copy_engine_idle_spin_is_an_option_with_the_native_default():
    assert _core.CopyEngine().idle_spin_us == 50
    assert _core.CopyEngine(1, idle_spin_us=0).idle_spin_us == 0
    with pytest.raises(ValueError, match="idle_spin_us must be >= 0, got -1"):
        _core.CopyEngine(1, idle_spin_us=-1)
    with pytest.raises(TypeError):
        _core.CopyEngine(1, 5)  # keyword only: a second positional number is refused
