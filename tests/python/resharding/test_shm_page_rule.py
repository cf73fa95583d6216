"""The shm service reads a large remote task (2 MiB or more) by cross-memory attach only when
its source lies in huge pages: from 4 KiB pages process_vm_readv pins page by page and ran slower
than the pipeline's two copies (302 MB each way of Megatron's torch tensors, 2 cores:
40-44 ms against 31-33 ms), from huge pages (numpy's large arrays) faster.

In-process: ``_core.huge_page_bytes`` against the kernel's own account of the same mapping
(/proc/self/smaps AnonHugePages), the flags a sender puts on its sends, and the plan's
rule for them.
"""

from __future__ import annotations

import ctypes
import mmap

import numpy as np
import pytest

from tensorxfer import _core
from tensorxfer.resharding.copy_services import _tensors
from tensorxfer.resharding.copy_services._shm_plan import (ATTACH_PAGE_RULE_BYTES, FLAG_ATTACH_READABLE,
                                                            attach_flags, build_shm_plan)
from tensorxfer.resharding.copy_services.planning import matching

MIB = 1 << 20


def address_of(mapping: mmap.mmap) -> int:
    return ctypes.addressof(ctypes.c_char.from_buffer(mapping))


def smaps_huge_bytes(address: int) -> int:
    """AnonHugePages of the mapping that starts at ``address``, from /proc/self/smaps."""
    with open("/proc/self/smaps") as smaps:
        inside = False
        for line in smaps:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                inside = int(head.split("-")[0], 16) == address
            elif inside and head == "AnonHugePages:":
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no mapping starts at {address:#x}")


def touched_mapping(nbytes: int, advice: int) -> mmap.mmap:
    mapping = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    mapping.madvise(advice)
    mapping.write(b"\x01" * nbytes)  # faults every page in
    return mapping


def kernel_answers() -> bool:
    probe = np.zeros(1, np.uint8)
    return int(_core.huge_page_bytes(np.array([probe.ctypes.data], np.uint64), np.array([1], np.uint64))[0]) >= 0


needs_pagemap_scan = pytest.mark.skipif(not kernel_answers(), reason="the kernel has no PAGEMAP_SCAN (Linux < 6.7)")


@needs_pagemap_scan
@pytest.mark.parametrize("advice", ["MADV_HUGEPAGE", "MADV_NOHUGEPAGE"])
def test_huge_page_bytes_agrees_with_the_kernels_account(advice):
    if not hasattr(mmap, advice):
        pytest.skip(f"mmap.{advice} is not defined on this platform")
    mapping = touched_mapping(16 * MIB, getattr(mmap, advice))
    start = address_of(mapping)
    got = int(_core.huge_page_bytes(np.array([start], np.uint64), np.array([16 * MIB], np.uint64))[0])
    assert got == smaps_huge_bytes(start)
    if advice == "MADV_NOHUGEPAGE":
        assert got == 0
    # A sub-range counts only its own bytes.
    part = int(_core.huge_page_bytes(np.array([start + 8 * MIB], np.uint64), np.array([MIB], np.uint64))[0])
    assert 0 <= part <= MIB and (part == 0 or got > 0)


def spans_of(arrays) -> _tensors.Spans:
    return _tensors.describe_many(list(arrays))


@needs_pagemap_scan
def test_large_sources_are_flagged_for_cross_memory_reads_only_from_huge_pages():
    private = np.frombuffer(touched_mapping(8 * MIB, mmap.MADV_NOHUGEPAGE), np.uint8)
    huge_source = np.ones(32 * MIB, np.uint8)  # numpy advises huge pages for large arrays
    sources = [private, private[:MIB], private[:MIB // 2], huge_source, huge_source[::2]]
    flags = attach_flags(spans_of(sources), np.arange(len(sources)), MIB // 2 + 1)
    huge = int(_core.huge_page_bytes(np.array([huge_source.ctypes.data], np.uint64),
                                     np.array([huge_source.nbytes], np.uint64))[0])
    # Large in 4 KiB pages: no; below the page rule's size: yes, whatever its pages; below
    # cma_min_bytes: no; large and not contiguous (staged into new pages at run time): no.
    assert list(flags[[0, 1, 2, 4]]) == [0, FLAG_ATTACH_READABLE, 0, 0]
    assert flags[3] == (FLAG_ATTACH_READABLE if 2 * huge >= huge_source.nbytes else 0)
    assert ATTACH_PAGE_RULE_BYTES == 2 * MIB


def test_the_plan_reads_only_flagged_large_tasks_by_cross_memory_attach():
    # Rank 0 sends three 2 MiB tasks to rank 1: one flagged huge, one not, one flagged but
    # below cma_min_bytes (4 MiB would be needed). Only the first is read directly.
    nbytes = [2 * MIB, 2 * MIB, 2 * MIB]
    flags = [FLAG_ATTACH_READABLE, 0, FLAG_ATTACH_READABLE]
    sends0 = matching.op_table([1, 2, 3], 0, 1, nbytes, flags)
    recvs1 = matching.op_table([1, 2, 3], 0, 1, nbytes)
    empty = matching.op_table([], 0, 0, [])
    tables = [(sends0, empty), (empty, recvs1)]
    pairs = np.ones((2, 2), bool)
    for cma_min_bytes, direct_ids in ((MIB, [1, 3]), (2 * MIB + 1, [])):
        plans = [build_shm_plan("test", rank, 2, tables, [b""] * 2, 4 * MIB, 100, cma_min_bytes, pairs)
                 for rank in (0, 1)]
        # The schedule's task ids are key order: task_id 1, 2, 3 -> 0, 1, 2.
        assert sorted(int(i) + 1 for i in plans[1].direct_recv_ids) == direct_ids
        assert sorted(int(i) + 1 for i in plans[0].direct_send_ids) == direct_ids
        piped = sorted(int(i) + 1 for i in plans[1].pipe_recv_ids)
        assert piped == sorted(set([1, 2, 3]) - set(direct_ids))
    # Never by attach where the kernel forbids it, flagged or not.
    plan = build_shm_plan("test", 1, 2, tables, [b""] * 2, 4 * MIB, 100, MIB, np.zeros((2, 2), bool))
    assert plan.direct_recv_ids.size == 0 and plan.pipe_recv_ids.size == 3
