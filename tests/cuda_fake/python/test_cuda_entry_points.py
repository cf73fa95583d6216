"""The core's CUDA entry points, called from Python, against the fake CUDA runtime:
the GIL around blocking calls, error mapping, pinning, managed memory, IPC memory."""

from __future__ import annotations

import ctypes
import multiprocessing
import uuid

import fake_cuda_workers
import numpy as np
import pytest

from tensorxfer import UnsupportedError, _core
from tensorxfer.inference import unified_memory as um

fake = _core.fake_cuda
CUDA_ERROR_NOT_SUPPORTED = 801


def blocking_calls_with_the_gil():
    return [call for call in fake.calls() if call["blocking"] and call["gil_held"]]


def managed_array(nbytes: int) -> np.ndarray:
    """A uint8 numpy array over memory from the extension's UVM allocator (cudaMallocManaged).

    Never freed: a failing test's traceback may still show the array after the test ends,
    and a view of freed memory would crash the report instead of printing it.
    """
    library = ctypes.CDLL(_core.__file__)
    library.tensorxfer_uvm_malloc.restype = ctypes.c_void_p
    library.tensorxfer_uvm_malloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    pointer = library.tensorxfer_uvm_malloc(nbytes, 0, None)
    assert pointer, ctypes.CDLL(_core.__file__).tensorxfer_uvm_last_error()
    return np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(pointer))


# ---- the GIL ------------------------------------------------------------------------
def test_the_fake_sees_the_gil_held_by_the_calling_thread():
    fake.set_device_count(1)
    # cuda_status makes no blocking call; a blocking call through ctypes keeps the GIL (PyDLL).
    ctypes.PyDLL(_core.__file__).cudaDeviceSynchronize()
    assert [call["gil_held"] for call in fake.calls() if call["function"] == "cudaDeviceSynchronize"] == [True]
    assert fake.gil_violations() == 1


def test_ipc_memory_releases_the_gil_around_cudamalloc_copies_and_free():
    memory = _core.IpcMemory.create_local(0, 1, 4096, "cuda")
    memory.map_peers([memory.local_handle])
    memory.close()
    functions = [call["function"] for call in fake.calls() if call["blocking"]]
    assert {"cudaMemcpy", "cudaDeviceSynchronize", "cudaFree"} <= set(functions)
    assert blocking_calls_with_the_gil() == []


def test_managed_advice_releases_the_gil():
    array = managed_array(8192)
    um.advise_managed_tensor_preferred_location(array, device=0)
    um.advise_managed_tensor_accessed_by(array, device=0)
    um.prefetch_managed_tensor(array, device=0)
    kinds = [request[0] for request in fake.managed_requests()]
    assert kinds == ["preferred_location", "accessed_by", "prefetch"]
    assert blocking_calls_with_the_gil() == []


# ---- runtime / driver mismatch ------------------------------------------------------------
def test_an_old_driver_is_unsupported_and_named_with_both_versions():
    fake.set_driver_version(12040)
    status = _core.cuda_status()
    assert status["device_count"] == 0
    assert "CUDA 12.4" in status["reason"] and "CUDA 13.0" in status["reason"], status["reason"]
    with pytest.raises(UnsupportedError, match=r"CUDA 12\.4.*CUDA 13\.0"):
        _core.CudaCopySubmitter(0)


@pytest.mark.parametrize("error", [802, 804])
def test_driver_mismatch_errors_are_unsupported(error):
    fake.fail("cudaGetDeviceCount", error)
    with pytest.raises(UnsupportedError, match=r"CUDA 13\.0"):
        _core.CudaCopySubmitter(0)


# ---- pinning -------------------------------------------------------------------------------
def test_register_checks_the_whole_range_and_leaves_no_error_behind():
    buffer = np.zeros(1 << 16, np.uint8)
    address = buffer.ctypes.data
    assert _core.cuda_host_register(address, 4096, 0) is True
    assert _core.cuda_host_register(address, 4096, 0) is False  # already pinned: nothing to undo
    with pytest.raises(ValueError, match="pinned only in part"):
        _core.cuda_host_register(address + 2048, 4096, 0)
    fake.fail("cudaHostRegister", CUDA_ERROR_NOT_SUPPORTED)
    with pytest.raises(UnsupportedError, match="cudaHostRegister"):
        _core.cuda_host_register(address + 8192, 4096, 0)
    assert fake.peek_last_error() == 0
    _core.cuda_host_unregister(address, 0)
    assert fake.registered_ranges() == 0
    assert blocking_calls_with_the_gil() == []


# ---- managed memory ------------------------------------------------------------------------
def test_gpu_prefetch_without_concurrent_managed_access_is_unified_memory_unsupported():
    array = managed_array(4096)
    fake.set_concurrent_managed_access(False)
    with pytest.raises(um.UnifiedMemoryUnsupportedError, match="concurrent managed access"):
        um.prefetch_managed_tensor(array, device=0)
    assert fake.managed_requests() == []  # nothing was prefetched


# ---- IPC memory across processes -----------------------------------------------------------
def run_two_ranks(target) -> list:
    """Runs target(rank, group name, queue) in two spawned processes; their results in rank order."""
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    name = f"fake-cuda-{uuid.uuid4().hex[:8]}"
    workers = [context.Process(target=target, args=(rank, name, results)) for rank in range(2)]
    for worker in workers:
        worker.start()
    outcome = sorted(results.get(timeout=60) for _ in workers)
    for worker in workers:
        worker.join(timeout=60)
        assert worker.exitcode == 0
    return outcome


def test_two_processes_map_each_others_cuda_memory():
    outcome = run_two_ranks(fake_cuda_workers.ipc_rank)
    assert outcome[0][1] == bytes([2]) * 8 and outcome[1][1] == bytes([1]) * 8
    assert [gil for *_, gil in outcome] == [0, 0]


def test_close_frees_no_allocation_a_peer_still_has_mapped():
    # (rank, frees of memory a peer still had open, handles still open, allocations left)
    assert run_two_ranks(fake_cuda_workers.close_rank) == [(0, 0, 0, 0), (1, 0, 0, 0)]


def test_ipc_memory_allocates_on_the_gpu_it_is_given():
    from tensorxfer.runtime import IpcMemory, LocalGroup

    fake.set_device_count(2)
    with LocalGroup.join(f"fake-cuda-{uuid.uuid4().hex[:8]}", rank=0, world_size=1, timeout=30) as group:
        with IpcMemory.create(group, 64, device="cuda:1", timeout=30):
            pass
        with pytest.raises(ValueError, match=r"in \[0, 2\), got 2"):
            IpcMemory.create(group, 64, device="cuda:2", timeout=30)
        with pytest.raises(ValueError, match="'cpu', 'cuda' or 'cuda:N'"):
            IpcMemory.create(group, 64, device="cuda:x", timeout=30)
    mallocs = [call["device"] for call in fake.calls() if call["function"] == "cudaMalloc"]
    frees = [call["device"] for call in fake.calls() if call["function"] == "cudaFree"]
    assert (mallocs, frees) == ([1], [1])


def test_a_rank_that_cannot_map_fails_every_rank_and_frees_nothing_still_open():
    # (rank, what create raised, frees of memory a peer still had open, allocations left):
    # rank 1's own mapping error, and on rank 0 the construction agreement's TensorxferError
    # naming rank 1 (the same for CPU and CUDA memory since issue 13's status exchange).
    assert run_two_ranks(fake_cuda_workers.failing_map_rank) == [
        (0, "TensorxferError", 0, 0), (1, "TensorxferError", 0, 0)]
