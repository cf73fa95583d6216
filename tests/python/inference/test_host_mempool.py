"""create_host_mempool: page-aligned numpy arrays and torch tensors, huge pages, mlock, lifetime."""

from __future__ import annotations

import gc
import threading

import numpy as np
import pytest
from unified_memory_helpers import PAGE, kernel_numa_refusal, mapping_containing, resident_pages

from tensorxfer import _core
from tensorxfer.inference import unified_memory as um

HUGE_PAGE = _core.huge_page_size()


def test_numpy_arrays_are_page_aligned_fresh_and_shaped():
    with um.create_host_mempool() as pool:
        array = pool.empty((3, 5, 7), np.float64)
        assert isinstance(array, np.ndarray)
        assert array.shape == (3, 5, 7) and array.dtype == np.float64
        assert array.ctypes.data % PAGE == 0
        assert array.flags.writeable and array.flags.c_contiguous
        assert resident_pages(array) == 0, "first touch is left to the caller"
        assert not array.any()
        zeros = pool.zeros(10, "int32")
        assert zeros.shape == (10,) and zeros.dtype == np.int32 and not zeros.any()


def test_torch_tensors_come_out_for_torch_dtypes():
    torch = pytest.importorskip("torch")
    with um.create_host_mempool() as pool:
        for dtype in (torch.float32, torch.bfloat16, torch.int8, torch.bool):
            tensor = pool.zeros((4, 33), dtype)
            assert isinstance(tensor, torch.Tensor)
            assert tensor.dtype == dtype and tuple(tensor.shape) == (4, 33)
            assert tensor.data_ptr() % PAGE == 0 and tensor.is_contiguous()
            assert not tensor.any()
        empty = pool.empty((0, 4), torch.float32)
        assert tuple(empty.shape) == (0, 4)
        copy = pool.copy_of(torch.arange(10.0))
        assert pool.block_of(copy) is not None and copy.tolist() == list(range(10))


def test_copy_of_numpy_and_bad_inputs():
    with um.create_host_mempool() as pool:
        source = np.arange(24, dtype=np.int16).reshape(4, 6)
        copy = pool.copy_of(source)
        assert (copy == source).all() and copy.ctypes.data % PAGE == 0
        with pytest.raises(TypeError, match="numpy array or a torch tensor"):
            pool.copy_of([1, 2, 3])
        with pytest.raises(ValueError, match="negative"):
            pool.empty((2, -1))
        with pytest.raises(TypeError, match="shape"):
            pool.empty("big")
        with pytest.raises(TypeError, match="nbytes"):
            pool.allocate_block(1.5)


@pytest.mark.parametrize("huge_pages", [False, True])
def test_sizes_near_size_max_are_refused_not_wrapped(huge_pages):
    # Rounding 2**64 - 2 bytes up to whole (huge) pages does not fit in size_t.
    with um.create_host_mempool(huge_pages=huge_pages) as pool:
        with pytest.raises(ValueError, match="overflows"):
            pool.allocate_block(2**64 - 2)
        assert pool.allocate_block(10).huge_pages in ("none", "transparent", "hugetlb")


def test_released_memory_is_reused_then_unmapped_when_pool_and_arrays_are_gone():
    pool = um.create_host_mempool()
    first = pool.empty(4 * PAGE, np.uint8)
    address = first.ctypes.data
    first[:] = 1
    del first
    gc.collect()
    stats = pool.stats()
    assert stats["live_blocks"] == 0 and stats["cached_blocks"] == 1
    again = pool.empty(4 * PAGE, np.uint8)
    assert again.ctypes.data == address and pool.block_of(again).reused
    assert pool.stats()["reused_blocks"] == 1
    assert mapping_containing(address) is not None

    del pool  # the array keeps its block (and the memory) alive
    gc.collect()
    again[:] = 9
    assert (again == 9).all()
    del again
    gc.collect()
    line = mapping_containing(address)
    assert line is None or not line.startswith(f"{address:x}-"), f"block still mapped: {line}"


def test_torch_tensor_keeps_its_block_alive():
    torch = pytest.importorskip("torch")
    with um.create_host_mempool() as pool:
        tensor = pool.empty((1024,), torch.float32)
        assert pool.stats()["live_blocks"] == 1
        view = tensor[10:20]
        del tensor
        gc.collect()
        assert pool.stats()["live_blocks"] == 1
        view.fill_(3.0)
        del view
        gc.collect()
        assert pool.stats()["live_blocks"] == 0


def test_closed_pool_refuses_allocations_and_frees_its_cache():
    pool = um.create_host_mempool()
    kept = pool.empty(PAGE, np.uint8)
    pool.empty(PAGE, np.uint8)  # released at once: cached
    gc.collect()
    assert pool.stats()["cached_blocks"] == 1
    pool.close()
    assert pool.closed and pool.stats()["cached_blocks"] == 0
    with pytest.raises(ValueError, match="closed"):
        pool.empty(10, np.uint8)
    kept[:] = 5  # still valid
    pool.close()  # idempotent


def test_cache_limit():
    with um.create_host_mempool(max_cached_bytes=0) as pool:
        pool.empty(PAGE, np.uint8)
        gc.collect()
        assert pool.stats()["cached_blocks"] == 0
        assert pool.stats()["mapped_blocks"] == 1


def test_huge_pages_are_used_or_the_fallback_is_reported():
    with um.create_host_mempool(huge_pages=True) as pool:
        assert pool.huge_pages
        large = pool.empty(2 * HUGE_PAGE, np.uint8)
        block = pool.block_of(large)
        assert block.huge_pages in ("hugetlb", "transparent"), block.huge_pages_note
        assert large.ctypes.data % HUGE_PAGE == 0
        if block.huge_pages == "transparent":
            assert "MAP_HUGETLB" in block.huge_pages_note
            assert pool.stats()["transparent_blocks"] == 1
        small = pool.empty(100, np.uint8)
        assert pool.block_of(small).huge_pages == "none"
        assert "smaller than one huge page" in pool.block_of(small).huge_pages_note
        large[:] = 1


def test_lock_pages_locks_or_reports_why_not():
    with um.create_host_mempool(lock_pages=True) as pool:
        array = pool.empty(16 * PAGE, np.uint8)
        block = pool.block_of(array)
        if block.locked:
            assert block.lock_error == "" and pool.stats()["locked_blocks"] == 1
            assert resident_pages(array) == 16, "mlock makes the pages resident"
        else:
            assert "RLIMIT_MEMLOCK" in block.lock_error and pool.stats()["lock_failures"] == 1


def test_numa_node_option():
    if kernel_numa_refusal():
        pytest.skip(kernel_numa_refusal())
    nodes = um.numa_nodes_with_memory()
    with um.create_host_mempool(numa_node=nodes[0]) as pool:
        assert pool.numa_node == nodes[0]
        array = pool.empty(8 * PAGE, np.uint8)
        array[:] = 1
        assert um.numa_nodes_of(array) == [nodes[0]] * 8
    with pytest.raises(ValueError, match=r"numa_node must be -1 \(no binding\) or one of .*got 999"):
        um.create_host_mempool(numa_node=999)
    with pytest.raises(ValueError, match="numa_node"):
        um.create_host_mempool(numa_node=-2)
    with pytest.raises(TypeError, match="huge_pages"):
        um.create_host_mempool(huge_pages="yes")


def test_threads_allocate_and_release_concurrently():
    errors = []
    with um.create_host_mempool() as pool:

        def work(seed):
            try:
                for i in range(100):
                    array = pool.empty(((i % 3) + 1) * PAGE, np.uint8)
                    array[:] = seed
                    if not (array == seed).all():
                        raise AssertionError("two threads got the same block")
            except BaseException as exc:  # collected and re-raised below
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(seed,)) for seed in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        gc.collect()
        stats = pool.stats()
    if errors:
        raise errors[0]
    assert stats["live_blocks"] == 0
    assert stats["mapped_blocks"] + stats["reused_blocks"] == 400
