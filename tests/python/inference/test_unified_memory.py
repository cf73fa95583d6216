"""The documented unified-memory API: names, allocator setup, prefetch and advice on host tensors."""

from __future__ import annotations

import ctypes
import enum
import threading
import time

import numpy as np
import pytest
from unified_memory_helpers import (PAGE, gpu_status, kernel_numa_refusal, numa_policy, page_count, reset_compile_state,
                                    resident_pages)

import tensorxfer
from tensorxfer import _core
from tensorxfer.inference import unified_memory as um

HAS_GPU, NO_GPU_REASON = gpu_status()
needs_no_gpu = pytest.mark.skipif(HAS_GPU, reason="a CUDA device is present: covered by test_unified_memory_cuda.py")

REFERENCE_NAMES = [
    "CompilationState",
    "UnifiedMemoryUnsupportedError",
    "UnifiedMemoryCompileTimeoutError",
    "_compile_timeout",
    "compile_allocator",
    "create_unified_mempool",
    "_get_ctypes_lib",
    "prefetch_managed_tensor",
    "advise_managed_tensor_preferred_location",
    "advise_managed_tensor_accessed_by",
    "prefetch_managed_module_parameters",
    "advise_managed_module_parameters_preferred_location",
]
REFERENCE_DATA = ["_compilation_state", "_alloc", "_mod", "_so_path", "_ctypes_lib", "_ctypes_lock", "_compilation_error"]


@pytest.fixture
def fresh_compile_state(monkeypatch):
    """Run a test against UNATTEMPTED module state; the real state is restored afterwards."""
    reset_compile_state(monkeypatch)
    return monkeypatch


# ---- names -------------------------------------------------------------------------------
def test_every_reference_name_exists():
    for name in REFERENCE_NAMES + REFERENCE_DATA:
        assert hasattr(um, name), name
    assert [m.name for m in um.CompilationState] == ["UNATTEMPTED", "FAILURE", "SUCCESS"]
    assert issubclass(um.CompilationState, enum.Enum)
    assert issubclass(um.UnifiedMemoryCompileTimeoutError, um.UnifiedMemoryUnsupportedError)
    assert issubclass(um.UnifiedMemoryUnsupportedError, Exception)
    assert issubclass(um.UnifiedMemoryUnsupportedError, tensorxfer.UnsupportedError)
    assert isinstance(um._ctypes_lock, type(threading.Lock()))
    for name in REFERENCE_NAMES + ["create_host_mempool", "bind_to_numa_node", "numa_nodes_of"]:
        assert getattr(um, name).__doc__, f"{name} has no docstring"


def test_ctypes_lib_is_the_extension_and_exports_the_allocator():
    lib = um._get_ctypes_lib()
    assert isinstance(lib, ctypes.CDLL)
    assert lib._name == _core.__file__
    assert um._get_ctypes_lib() is lib
    for symbol in ("tensorxfer_uvm_malloc", "tensorxfer_uvm_free", "tensorxfer_uvm_last_error"):
        assert hasattr(lib, symbol), symbol


def test_threads_share_one_ctypes_lib(monkeypatch):
    monkeypatch.setattr(um, "_ctypes_lib", None)
    results, barrier = [], threading.Barrier(6)

    def load():
        barrier.wait(timeout=10)
        results.append(um._get_ctypes_lib())

    threads = [threading.Thread(target=load) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert len(results) == 6 and all(lib is results[0] for lib in results)


@needs_no_gpu
def test_c_allocator_fails_cleanly_without_a_device():
    lib = um._get_ctypes_lib()
    malloc, free, last_error = lib.tensorxfer_uvm_malloc, lib.tensorxfer_uvm_free, lib.tensorxfer_uvm_last_error
    malloc.restype, malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    free.restype, free.argtypes = None, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    last_error.restype = ctypes.c_char_p
    assert malloc(1 << 20, 0, None) is None
    assert NO_GPU_REASON in last_error().decode()
    assert malloc(0, 0, None) is None  # zero bytes: no allocation, no error
    assert last_error() == b""
    free(None, 0, 0, None)


# ---- compile_allocator ----------------------------------------------------------------------
@needs_no_gpu
def test_compile_allocator_records_failure_with_the_reason(fresh_compile_state):
    assert um.compile_allocator() is um.CompilationState.FAILURE
    assert um._compilation_state is um.CompilationState.FAILURE
    assert NO_GPU_REASON in um._compilation_error
    assert um._alloc is None


def test_compile_allocator_runs_once_across_threads(fresh_compile_state):
    calls = []
    real_load = um._load_allocator

    def slow_load():
        calls.append(threading.get_ident())
        time.sleep(0.2)  # every other thread arrives while this one is loading
        return real_load()

    fresh_compile_state.setattr(um, "_load_allocator", slow_load)
    barrier, results = threading.Barrier(8), []

    def compile_():
        barrier.wait(timeout=10)
        results.append(um.compile_allocator())

    threads = [threading.Thread(target=compile_) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert len(calls) == 1
    assert len(results) == 8 and len(set(results)) == 1
    assert results[0] is not um.CompilationState.UNATTEMPTED
    assert um.compile_allocator() is results[0]
    assert len(calls) == 1


def test_compile_allocator_records_success_and_what_it_loaded(fresh_compile_state):
    loaded = (object(), _core, _core.__file__)
    fresh_compile_state.setattr(um, "_load_allocator", lambda: loaded)
    assert um.compile_allocator() is um.CompilationState.SUCCESS
    assert (um._alloc, um._mod, um._so_path) == loaded
    assert um._compilation_error is None


# The timeout of the allocator setup: test_compile_timeout.py.


# ---- create_unified_mempool ------------------------------------------------------------------
@pytest.mark.parametrize("variable", ["PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"])
def test_create_unified_mempool_refuses_expandable_segments(monkeypatch, variable):
    monkeypatch.setenv(variable, "max_split_size_mb:64, expandable_segments:True")
    with pytest.raises(um.UnifiedMemoryUnsupportedError, match=f"{variable}=.*expandable_segments"):
        um.create_unified_mempool()


@needs_no_gpu
def test_create_unified_mempool_says_why_it_is_unavailable(monkeypatch):
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:False")
    with pytest.raises(um.UnifiedMemoryUnsupportedError, match="unified memory is unavailable") as info:
        um.create_unified_mempool()
    assert NO_GPU_REASON in str(info.value)


# ---- prefetch / advice on host tensors -------------------------------------------------------
def test_prefetch_to_cpu_populates_every_page_of_a_fresh_array():
    with um.create_host_mempool() as pool:
        array = pool.empty((256, 1024), np.float32)
        assert resident_pages(array) == 0
        assert um.prefetch_managed_tensor(array, device=-1) is None
        assert resident_pages(array) == page_count(array) == 256


def test_prefetch_covers_whole_pages_of_a_slice_and_keeps_contents():
    with um.create_host_mempool() as pool:
        block = pool.empty(8 * PAGE, np.uint8)
        block[:PAGE] = 7  # page 0 resident, the rest untouched
        window = block[2 * PAGE + PAGE // 2 : 4 * PAGE + PAGE // 2]  # covers pages 2, 3, 4
        um.prefetch_managed_tensor(window, device=-1)
        assert resident_pages(block) == 4
        assert resident_pages(block[5 * PAGE :]) == 0 and resident_pages(block[PAGE : 2 * PAGE]) == 0
        assert (block[:PAGE] == 7).all() and not block[PAGE:].any()


def test_prefetch_accepts_torch_and_read_only_numpy():
    torch = pytest.importorskip("torch")
    with um.create_host_mempool() as pool:
        weights = pool.empty((64, 1024), torch.float32).requires_grad_()
        um.prefetch_managed_tensor(weights, device=-1, stream=None)
        assert resident_pages(weights) == 64
    frozen = np.frombuffer(b"\x01" * (3 * PAGE), dtype=np.uint8)
    um.prefetch_managed_tensor(frozen, device=-1)
    assert frozen.sum() == 3 * PAGE


@pytest.mark.parametrize("call", ["prefetch", "preferred", "accessed_by"])
def test_empty_tensors_are_a_no_op(call):
    empty = np.empty((0, 16), np.float32)
    {
        "prefetch": lambda: um.prefetch_managed_tensor(empty, device=0),
        "preferred": lambda: um.advise_managed_tensor_preferred_location(empty, device=0),
        "accessed_by": lambda: um.advise_managed_tensor_accessed_by(empty, device=0),
    }[call]()


@needs_no_gpu
@pytest.mark.parametrize("call", ["prefetch", "preferred", "accessed_by"])
def test_gpu_device_without_a_gpu_says_why(call):
    array = np.ones(1024, np.float32)
    function = {
        "prefetch": um.prefetch_managed_tensor,
        "preferred": um.advise_managed_tensor_preferred_location,
        "accessed_by": um.advise_managed_tensor_accessed_by,
    }[call]
    with pytest.raises(um.UnifiedMemoryUnsupportedError, match="GPU device 0 was requested") as info:
        function(array, device=0)
    assert NO_GPU_REASON in str(info.value)


def test_accessed_by_cpu_raises_as_the_reference_says():
    with pytest.raises(ValueError, match=r"must be a GPU id \(>= 0\), got -1"):
        um.advise_managed_tensor_accessed_by(np.ones(4, np.float32), device=-1)


def test_preferred_location_cpu_sets_a_numa_preference_for_the_local_node():
    if kernel_numa_refusal():
        pytest.skip(kernel_numa_refusal())
    with um.create_host_mempool() as pool:
        array = pool.empty(4 * PAGE, np.uint8)
        assert numa_policy(array)["mode"] == "default"
        um.advise_managed_tensor_preferred_location(array, device=-1)
        policy = numa_policy(array)
        assert policy["mode"] == "preferred"
        assert len(policy["nodes"]) == 1 and policy["nodes"][0] in um.numa_nodes_with_memory()


@pytest.mark.parametrize(
    "bad, error, match",
    [
        ("not a tensor", TypeError, "tensor"),
        (None, TypeError, "tensor must be a tensor"),
        (42, TypeError, "tensor"),
        (object(), TypeError, "tensor"),
        (np.ones((4, 8), np.float32)[:, ::2], ValueError, "tensor must be C-contiguous"),
    ],
)
def test_bad_tensors_raise_naming_the_argument(bad, error, match):
    for call in (um.prefetch_managed_tensor, um.advise_managed_tensor_preferred_location):
        with pytest.raises(error, match=match):
            call(bad, device=-1)


def test_bad_torch_tensors_raise():
    torch = pytest.importorskip("torch")
    with pytest.raises(ValueError, match="cpu or cuda tensor, got device meta"):
        um.prefetch_managed_tensor(torch.empty(4, device="meta"), device=-1)
    with pytest.raises(ValueError, match="dense"):
        um.prefetch_managed_tensor(torch.eye(3).to_sparse(), device=-1)
    with pytest.raises(ValueError, match="C-contiguous"):
        um.prefetch_managed_tensor(torch.ones(4, 4).t(), device=-1)


@pytest.mark.parametrize("device, error", [(-2, ValueError), ("0", TypeError), (True, TypeError), (1.5, TypeError)])
def test_bad_device_ids_raise(device, error):
    array = np.ones(8, np.float32)
    with pytest.raises(error, match="device"):
        um.prefetch_managed_tensor(array, device=device)
    with pytest.raises(error, match="device"):
        um.advise_managed_tensor_preferred_location(array, device=device)


def test_bad_stream_raises():
    with pytest.raises(TypeError, match="stream"):
        um.prefetch_managed_tensor(np.ones(8, np.float32), device=-1, stream="default")
