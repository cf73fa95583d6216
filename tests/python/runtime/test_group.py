"""LocalGroup in one process: arguments, errors, handles, lifetime, host checks."""

from __future__ import annotations

import os
import re
import pickle
import threading
import uuid

import pytest

import tensorxfer
from tensorxfer.runtime import GroupHandle, LocalGroup
from tensorxfer.runtime.group import _not_local_error, ranks_not_on_host


def unique_name(what: str) -> str:
    return f"pytest-{what}-{uuid.uuid4().hex[:12]}"


def group_files() -> set:
    return {name for name in os.listdir("/dev/shm") if name.startswith("tensorxfer-group-")}


def test_a_one_rank_group_gathers_its_own_bytes_and_removes_its_segment():
    before = group_files()
    with LocalGroup.join(unique_name("solo"), rank=0, world_size=1, timeout=5) as group:
        assert (group.rank, group.world_size) == (0, 1)
        assert len(group_files() - before) == 1
        group.barrier(timeout=1.0)
        assert group.all_gather_bytes(b"abc") == [b"abc"]
        assert group.all_gather_bytes(bytearray(b"xy")) == [b"xy"]
        assert group.all_gather_bytes(memoryview(b"z" * 200_000)) == [b"z" * 200_000]
        assert group.rank_alive(0)
    assert group.closed
    assert group_files() == before


def test_threads_as_ranks_gather_in_rank_order():
    name, world_size = unique_name("threads"), 3
    results = [None] * world_size

    def rank_body(rank: int) -> None:
        with LocalGroup.join(name, rank=rank, world_size=world_size, timeout=20) as group:
            results[rank] = group.all_gather_bytes(bytes([rank]) * (rank + 1), timeout=20)

    threads = [threading.Thread(target=rank_body, args=(rank,)) for rank in range(world_size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    expected = [b"\x00", b"\x01\x01", b"\x02\x02\x02"]
    assert results == [expected] * world_size


def test_join_times_out_naming_the_missing_ranks():
    with pytest.raises(TimeoutError, match=r"ranks 1, 2 of world_size 3 did not join within 0\.100 s"):
        LocalGroup.join(unique_name("timeout"), rank=0, world_size=3, timeout=0.1)


def test_arguments_are_checked_naming_the_argument():
    with pytest.raises(TypeError, match="name must be a str"):
        LocalGroup.join(b"x", rank=0, world_size=1)
    with pytest.raises(ValueError, match="name must be 1..200 bytes"):
        LocalGroup.join("", rank=0, world_size=1)
    with pytest.raises(ValueError, match="name must be 1..200 bytes"):
        LocalGroup.join("é" * 101, rank=0, world_size=1)
    with pytest.raises(TypeError, match="^rank: expected an integer rank, got bool$"):
        LocalGroup.join("x", rank=True, world_size=1)
    with pytest.raises(ValueError, match=r"^rank: expected a rank in \[0, 2\), got 2$"):
        LocalGroup.join("x", rank=2, world_size=2)
    with pytest.raises(ValueError, match=r"^world_size: expected an integer in \[1, 1024\], got 0$"):
        LocalGroup.join("x", rank=0, world_size=0)
    with pytest.raises(TypeError, match="LocalGroup.join: timeout must be None"):
        LocalGroup.join("x", rank=0, world_size=1, timeout="1")
    with pytest.raises(ValueError, match=r"LocalGroup.join: timeout must be None \(no deadline\) or a number of seconds >= 0"):
        LocalGroup.join("x", rank=0, world_size=1, timeout=-1)
    with pytest.raises(TypeError, match="handle must be a GroupHandle"):
        LocalGroup.from_handle(("x", 1), rank=0)
    with LocalGroup.join(unique_name("args"), rank=0, world_size=1) as group:
        with pytest.raises(TypeError, match="data must be bytes-like"):
            group.all_gather_bytes("text")
        with pytest.raises(ValueError, match=r"^rank: expected a rank in \[0, 1\), got 1$"):
            group.rank_alive(1)


def test_a_closed_group_refuses_collectives_and_close_is_idempotent():
    group = LocalGroup.join(unique_name("closed"), rank=0, world_size=1)
    group.close()
    group.close()
    for call in (group.barrier, lambda: group.all_gather_bytes(b""), group.check_peers):
        with pytest.raises(ValueError, match="LocalGroup is closed"):
            call()


def test_groups_are_not_picklable_but_their_handles_are():
    with LocalGroup.join(unique_name("pickle"), rank=0, world_size=1) as group:
        with pytest.raises(TypeError, match="from_handle"):
            pickle.dumps(group)
        handle = pickle.loads(pickle.dumps(group.handle))
        assert handle == GroupHandle(group.name, 1)


def test_a_live_group_of_another_size_is_refused_naming_both_sizes():
    name = unique_name("sizes")
    with LocalGroup.join(name, rank=0, world_size=1):
        with pytest.raises(ValueError, match="has world_size 1, but this rank asked for world_size 2"):
            LocalGroup.join(name, rank=1, world_size=2, timeout=1)


def test_a_damaged_segment_raises_corrupt_segment_error():
    name = unique_name("damaged")
    with LocalGroup.join(name, rank=0, world_size=1):
        (path,) = [f for f in group_files() if name.replace("-", "_") in f]
        with open(os.path.join("/dev/shm", path), "r+b") as segment:
            segment.write(b"garbage!")
        with pytest.raises(tensorxfer.CorruptSegmentError, match="not a tensorxfer group segment"):
            LocalGroup.join(name, rank=0, world_size=1, timeout=1)
        os.unlink(os.path.join("/dev/shm", path))


def test_ranks_not_on_this_host_are_named():
    identities = [("a", "boot1"), ("a", "boot1"), ("b", "boot2"), ("a", "boot9")]
    assert ranks_not_on_host(identities) == [2, 3]
    assert ranks_not_on_host(identities[:2]) == []
    message = str(_not_local_error("from_torch", identities, [2, 3]))
    assert "ranks [2, 3] are not on the host of rank 0" in message
    assert "rank 2 on ('b', 'boot2')" in message


def test_from_torch_requires_an_initialized_process_group():
    pytest.importorskip("torch", reason="torch is not installed (pip install .[torch])")
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        pytest.skip("a process group is already initialized in this process")
    with pytest.raises(RuntimeError, match="torch.distributed is not initialized"):
        LocalGroup.from_torch()


def test_info_reports_futexes_across_processes_next_to_cross_memory_attach():
    import json
    import subprocess
    import sys

    def run(*args: str) -> str:
        result = subprocess.run([sys.executable, "-m", "tensorxfer", "info", *args], capture_output=True, text=True,
                                timeout=60, env=os.environ.copy())
        assert result.returncode == 0, result.stderr
        return result.stdout

    info = json.loads(run("--json"))
    # Linux futexes on MAP_SHARED memory work across processes: the probe forks and must see it.
    assert info["futexes_across_processes"]["works"] is True, info["futexes_across_processes"]
    assert "forked child" in info["futexes_across_processes"]["detail"]
    assert "permitted" in info["cross_memory_attach"]
    text = run()
    assert re.search(r"^futexes across processes +yes", text, re.MULTILINE), text
    assert "cross-memory attach" in text
