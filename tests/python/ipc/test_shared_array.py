"""tensorxfer.ipc.SharedArray: a numpy array in shared memory."""

from __future__ import annotations

import multiprocessing
import os
import pickle

import numpy as np
import pytest

import tensorxfer
from tensorxfer.ipc import SharedArray, SharedArrayHandle

from conftest import torch_or_skip


def shm_exists(name: str) -> bool:
    return os.path.exists("/dev/shm/" + name.lstrip("/"))


def test_create_and_attach_share_the_data():
    with SharedArray.create((100, 8), "float32") as store:
        assert store.shape == (100, 8) and store.dtype == np.float32 and store.nbytes == 3200
        assert np.all(store.array == 0)
        assert store.array.ctypes.data % 4096 == 0
        store.array[:] = np.arange(800, dtype=np.float32).reshape(100, 8)
        handle = pickle.loads(pickle.dumps(store.handle))
        assert handle == SharedArrayHandle(store.name, (100, 8), "<f4")
        with SharedArray.attach(handle) as other:
            assert np.array_equal(other.array, store.array)
            other.array[5, 5] = -1
            assert store.array[5, 5] == -1
            assert other.array.ctypes.data != store.array.ctypes.data
        assert os.stat("/dev/shm/" + store.name.lstrip("/")).st_mode & 0o777 == 0o600
    assert not shm_exists(store.name)


@pytest.mark.parametrize("dtype", ["uint8", "int64", "float64", "bool", np.float16, np.dtype("complex64")])
def test_dtypes_round_trip(dtype):
    with SharedArray.create((3, 5), dtype) as store, SharedArray.attach(store.handle) as other:
        assert other.dtype == np.dtype(dtype)
        assert other.shape == (3, 5)


def test_scalar_and_empty_shapes():
    with SharedArray.create((), "int32") as scalar:
        assert scalar.shape == () and scalar.nbytes == 4
    with SharedArray.create((0, 64), "float32") as empty, SharedArray.attach(empty.handle) as other:
        assert other.shape == (0, 64) and other.nbytes == 0
    with SharedArray.create(7, "uint8") as flat:
        assert flat.shape == (7,)


def test_tensor_is_zero_copy():
    torch = torch_or_skip()
    with SharedArray.create((4, 4), "float32") as store:
        tensor = store.tensor()
        assert tensor.dtype == torch.float32 and tuple(tensor.shape) == (4, 4)
        assert tensor.data_ptr() == store.array.ctypes.data
        tensor.fill_(2.5)
        assert np.all(store.array == 2.5)


def test_bad_arguments_are_refused():
    with pytest.raises(TypeError, match="dtype must hold plain data"):
        SharedArray.create((2,), object)
    with pytest.raises(TypeError, match="dtype"):
        SharedArray.create((2,), "not-a-dtype")
    with pytest.raises(ValueError, match="shape"):
        SharedArray.create((2, -1), "float32")
    with pytest.raises(TypeError, match="shape"):
        SharedArray.create(None, "float32")
    with pytest.raises(TypeError, match="SharedArrayHandle"):
        SharedArray.attach("tensorxfer-1-abc")


def test_attach_refuses_a_handle_that_does_not_match():
    with SharedArray.create((10,), "float32") as store:
        with pytest.raises(tensorxfer.CorruptSegmentError, match="expected 80 for shape"):
            SharedArray.attach(SharedArrayHandle(store.name, (20,), "float32"))
        assert shm_exists(store.name)


def test_close_is_idempotent_and_use_after_close_fails():
    store = SharedArray.create((4,), "int16")
    view = store.array
    store.close()
    store.close()
    assert not shm_exists(store.name)
    with pytest.raises(ValueError, match="closed"):
        _ = store.array
    with pytest.raises(ValueError, match="closed"):
        _ = store.handle
    view[0] = 3  # the mapping outlives close while a view holds it: no crash
    with pytest.raises(TypeError, match="handle"):
        pickle.dumps(SharedArray.create((1,), "uint8"))


def _fill_in_child(handle, value):
    with SharedArray.attach(handle) as array:
        assert float(array.array.sum()) == float(array.array.size)  # sees the parent's ones
        array.array[:] = value


@pytest.mark.multiprocess
@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_other_processes_see_and_change_the_data(method):
    with SharedArray.create((64, 3), "float64") as store:
        store.array[:] = 1.0
        process = multiprocessing.get_context(method).Process(target=_fill_in_child, args=(store.handle, 7.0))
        process.start()
        process.join(timeout=30)
        assert process.exitcode == 0
        assert np.all(store.array == 7.0)
    assert not shm_exists(store.name)
