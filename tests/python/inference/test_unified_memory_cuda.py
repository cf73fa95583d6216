"""Unified memory on a CUDA device: the managed pool, prefetch and advice.

Skipped, with the reason, where the core sees no CUDA device or torch has no CUDA.
"""

from __future__ import annotations

import pytest
from cuda_availability import fail_if_the_core_misses_torchs_gpu
from unified_memory_helpers import gpu_status

from tensorxfer import _core
from tensorxfer.inference import unified_memory as um

HAS_GPU, NO_GPU_REASON = gpu_status()
torch = pytest.importorskip("torch", reason="torch is not installed (pip install .[torch])")
fail_if_the_core_misses_torchs_gpu(torch)

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not HAS_GPU, reason=f"no CUDA device for the core: {NO_GPU_REASON}"),
    pytest.mark.skipif(not torch.cuda.is_available(), reason=f"torch {torch.__version__} has no CUDA device"),
]


@pytest.fixture(scope="module")
def managed_pool():
    assert um.compile_allocator() is um.CompilationState.SUCCESS, um._compilation_error
    return um.create_unified_mempool()


def managed_tensor(pool, *shape):
    with torch.cuda.use_mem_pool(pool):
        return torch.empty(shape, device="cuda")


def test_compile_allocator_succeeds_and_records_the_library():
    assert um.compile_allocator() is um.CompilationState.SUCCESS
    assert um._so_path == _core.__file__ and um._mod is _core
    assert um._alloc is not None and um._compilation_error is None


def test_pool_allocations_are_managed(managed_pool):
    tensor = managed_tensor(managed_pool, 1024, 1024)
    assert _core.cuda_is_managed_pointer(tensor.data_ptr())
    ordinary = torch.empty(1024, device="cuda")
    assert not _core.cuda_is_managed_pointer(ordinary.data_ptr())


def test_prefetch_round_trip_keeps_values_and_pointer(managed_pool):
    tensor = managed_tensor(managed_pool, 4096)
    tensor.copy_(torch.arange(4096.0, device="cuda"))
    pointer = tensor.data_ptr()
    stream = torch.cuda.Stream()
    um.prefetch_managed_tensor(tensor, device=-1, stream=stream)
    stream.synchronize()
    um.prefetch_managed_tensor(tensor, device=0)
    torch.cuda.synchronize()
    assert tensor.data_ptr() == pointer
    assert torch.equal(tensor.cpu(), torch.arange(4096.0))


def test_advice_on_managed_tensors(managed_pool):
    tensor = managed_tensor(managed_pool, 4096)
    um.advise_managed_tensor_preferred_location(tensor, device=-1)
    um.advise_managed_tensor_preferred_location(tensor, device=0)
    um.advise_managed_tensor_accessed_by(tensor, device=0)
    with pytest.raises(ValueError, match="GPU id"):
        um.advise_managed_tensor_accessed_by(tensor, device=-1)
    with pytest.raises(ValueError, match="device must be in"):
        um.prefetch_managed_tensor(tensor, device=torch.cuda.device_count())


def test_non_managed_cuda_tensor_is_refused():
    with pytest.raises(ValueError, match="not CUDA managed memory"):
        um.prefetch_managed_tensor(torch.ones(16, device="cuda"), device=-1)


def test_concurrent_managed_access_is_reported():
    assert isinstance(_core.cuda_concurrent_managed_access(0), bool)


def test_module_helpers_on_managed_parameters(managed_pool):
    with torch.cuda.use_mem_pool(managed_pool):
        model = torch.nn.Linear(256, 256, device="cuda")
    ordinary = torch.nn.Linear(8, 8, device="cuda")
    model.add_module("ordinary", ordinary)  # not UVM-allocated: skipped
    total = um.prefetch_managed_module_parameters(model, device=-1)
    assert total == (256 * 256 + 256) * 4
    um.advise_managed_module_parameters_preferred_location(model, device=0)
    assert um.prefetch_managed_module_parameters(model, device=0) == total
