"""Helpers for the IpcMemory / Communicator tests: a file-based stand-in group
(rank, world_size, all_gather_bytes, barrier) and the rank bodies the tests
spawn (module level, so spawn can import them)."""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import random
import time
import traceback
from typing import Any, Callable, Optional, Sequence

import numpy as np


class FileGroup:
    """Ranks that exchange bytes through files in a shared directory.

    Enough for building IpcMemory in tests without depending on a particular
    group implementation: every all_gather is a numbered round; each rank
    writes its file atomically (rename) and polls for the others'.
    """

    def __init__(self, directory: str, rank: int, world_size: int) -> None:
        self.directory = directory
        self.rank = rank
        self.world_size = world_size
        self._round = 0

    def all_gather_bytes(self, data: bytes, timeout: Optional[float] = None) -> Sequence[bytes]:
        self._round += 1
        prefix = os.path.join(self.directory, f"round{self._round}-")
        temporary = f"{prefix}{self.rank}.tmp"
        with open(temporary, "wb") as out:
            out.write(bytes(data))
        os.rename(temporary, f"{prefix}{self.rank}")
        deadline = None if timeout is None else time.monotonic() + timeout
        result: list[bytes] = []
        for rank in range(self.world_size):
            path = f"{prefix}{rank}"
            while not os.path.exists(path):
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"FileGroup: rank {rank} did not publish round {self._round}")
                time.sleep(0.001)
            with open(path, "rb") as source:
                result.append(source.read())
        return result

    def barrier(self, timeout: Optional[float] = None) -> None:
        self.all_gather_bytes(b"", timeout=timeout)


def reap(processes: Sequence[Any], queue: Any) -> None:
    """Joins spawned ranks (killing any still alive after 10 s) and closes their queue."""
    for process in processes:
        process.join(timeout=10)
        if process.is_alive():
            process.kill()
            process.join()
    queue.close()
    queue.join_thread()


def run_spawned(world: int, target: Callable[..., Any], args: tuple, directory: str, timeout: float = 90.0) -> list:
    """Runs target(group, queue, *args) on `world` spawned ranks; returns what each put on the queue, by rank.

    A rank that raised puts ("error", traceback); this fails the calling test.
    """
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    processes = [
        context.Process(target=_rank_main, args=(target, directory, rank, world, queue, args)) for rank in range(world)
    ]
    for process in processes:
        process.start()
    results: dict[int, Any] = {}
    try:
        deadline = time.monotonic() + timeout
        while len(results) < world:
            rank, value = queue.get(timeout=max(0.1, deadline - time.monotonic()))
            results[rank] = value
    finally:
        reap(processes, queue)
    errors = [value[1] for value in results.values() if isinstance(value, tuple) and value[:1] == ("error",)]
    assert not errors, "a rank failed:\n" + "\n".join(errors)
    return [results[rank] for rank in range(world)]


def _rank_main(target, directory, rank, world, queue, args) -> None:
    try:
        group = FileGroup(directory, rank, world)
        queue.put((rank, target(group, *args)))
    except BaseException:
        queue.put((rank, ("error", f"rank {rank}:\n{traceback.format_exc()}")))


# ---- references ----------------------------------------------------------------------

NUMPY_DTYPES = ["float32", "float64", "float16", "int32", "int64"]
OPS = ["sum", "avg", "max", "min"]


def rank_input(dtype: str, rank: int, count: int, seed: int) -> np.ndarray:
    """Rank `rank`'s input: multiples of 1/4 in [-4, 4] (floats) or integers (ints)."""
    rng = np.random.default_rng([seed, rank])
    values = rng.integers(-16, 17, size=count)
    if dtype.startswith("int"):
        return (values * 1000 + rank).astype(dtype)
    return (values * 0.25).astype(dtype)


def reference(inputs: list[np.ndarray], op: str) -> np.ndarray:
    """The result the collectives promise, computed in rank order like they do:
    float16 (and bfloat16) accumulate in float32 and round once; int32 in int64."""
    dtype = inputs[0].dtype
    accumulate = {np.dtype("float16"): np.float32, np.dtype("int32"): np.int64}.get(dtype, dtype.type)
    acc = inputs[0].astype(accumulate)
    for x in inputs[1:]:
        x = x.astype(accumulate)
        if op in ("sum", "avg"):
            acc = acc + x
        elif op == "max":
            acc = np.maximum(acc, x)
        else:
            acc = np.minimum(acc, x)
    if op == "avg":
        n = len(inputs)
        if np.issubdtype(acc.dtype, np.integer):
            acc = np.sign(acc) * (np.abs(acc) // n)
        else:
            acc = acc / accumulate(n)
    return acc.astype(dtype)


def float64_reference(inputs: list[np.ndarray], op: str) -> np.ndarray:
    stacked = np.stack([x.astype(np.float64) for x in inputs])
    return {"sum": stacked.sum(0), "avg": stacked.mean(0), "max": stacked.max(0), "min": stacked.min(0)}[op]


def digest(arrays: list) -> str:
    """One hash over the bytes of every result, to compare ranks bitwise."""
    h = hashlib.sha256()
    for array in arrays:
        h.update(np.ascontiguousarray(array).view(np.uint8).tobytes())
    return h.hexdigest()


# ---- rank bodies ---------------------------------------------------------------------


def all_reduce_matrix(group, max_bytes: int, counts: list, algorithms: list, seed: int) -> str:
    """Every numpy dtype x op x count x algorithm against the rank-order reference
    (exact) and a float64 one (close); returns a digest of all results."""
    from tensorxfer.runtime import Communicator

    results = []
    with Communicator(group, max_bytes=max_bytes, timeout=60) as comm:
        for dtype in NUMPY_DTYPES:
            for op in OPS:
                for count in counts:
                    for algorithm in algorithms:
                        seed += 1
                        inputs = [rank_input(dtype, r, count, seed) for r in range(group.world_size)]
                        tensor = inputs[group.rank].copy()
                        comm.all_reduce(tensor, op=op, algorithm=algorithm, timeout=60)
                        expected = reference(inputs, op)
                        where = f"{dtype} {op} count={count} {algorithm}"
                        np.testing.assert_array_equal(tensor, expected, err_msg=where)
                        np.testing.assert_allclose(
                            tensor.astype(np.float64), float64_reference(inputs, op), rtol=2e-3, atol=1.0
                            if dtype.startswith("int") else 1e-3, err_msg=where
                        )
                        results.append(tensor)
    return digest(results)


def torch_all_reduce(group, seed: int) -> str:
    """torch tensors (bfloat16, float16, float32, int64), including ones in comm.buffer (zero-copy)."""
    import torch

    from tensorxfer.runtime import Communicator

    results = []
    with Communicator(group, max_bytes=8192, buffer_bytes=1 << 16, timeout=60) as comm:
        for dtype in (torch.bfloat16, torch.float16, torch.float32, torch.int64):
            for count in (1, 33, 5000):
                seed += 1
                inputs = [
                    torch.from_numpy(rank_input("float32" if dtype.is_floating_point else "int64", r, count, seed)).to(dtype)
                    for r in range(group.world_size)
                ]
                acc = inputs[0].to(torch.float32 if dtype.is_floating_point else torch.int64)
                for x in inputs[1:]:
                    acc = acc + x.to(acc.dtype)
                expected = acc.to(dtype)
                tensor = inputs[group.rank].clone()
                comm.all_reduce(tensor, timeout=60)
                assert torch.equal(tensor, expected), (dtype, count)
                results.append(tensor.view(torch.uint8).numpy().copy())
                # The same in the zero-copy buffer: reduced in place there.
                staged = comm.buffer(dtype, (count,))
                staged.copy_(inputs[group.rank])
                comm.all_reduce(staged, timeout=60)
                assert torch.equal(staged, expected), ("buffer", dtype, count)
        x = torch.arange(12, dtype=torch.float32).reshape(3, 4)[:, :2]
        try:
            comm.all_reduce(x)
            raise AssertionError("a non-contiguous tensor was accepted")
        except ValueError as error:
            assert "contiguous" in str(error), error
    return digest(results)


def other_collectives(group, seed: int) -> str:
    """all_gather, reduce_scatter (sum, avg), broadcast from every root, barrier, with chunking."""
    from tensorxfer.runtime import Communicator

    world, rank = group.world_size, group.rank
    results = []
    with Communicator(group, max_bytes=4096, timeout=60) as comm:
        for count in (1, 1001, 4099):
            mine = rank_input("float32", rank, count, seed + count)
            gathered = np.empty(world * count, np.float32)
            comm.all_gather(gathered, mine, timeout=60)
            expected = np.concatenate([rank_input("float32", r, count, seed + count) for r in range(world)])
            np.testing.assert_array_equal(gathered, expected)
            full = [rank_input("int64", r, world * count, seed + 7 * count) for r in range(world)]
            block = np.empty(count, np.int64)
            comm.reduce_scatter(block, full[rank], op="sum", timeout=60)
            np.testing.assert_array_equal(block, reference(full, "sum")[rank * count:(rank + 1) * count])
            for root in range(world):
                data = rank_input("float64", root, count, seed) if rank == root else np.zeros(count)
                comm.broadcast(data, src=root, timeout=60)
                np.testing.assert_array_equal(data, rank_input("float64", root, count, seed))
            comm.barrier(timeout=60)
            results.append(gathered)  # the blocks differ by rank; they were checked above
    return digest(results)


def stress(group, rounds: int, max_bytes: int, seed: int) -> str:
    """Back-to-back all-reduces with random delays and changing shapes, checked every round."""
    from tensorxfer.runtime import Communicator

    world, rank = group.world_size, group.rank
    jitter = random.Random(seed * 1000 + rank)
    shapes = random.Random(seed)  # same on every rank
    h = hashlib.sha256()
    with Communicator(group, max_bytes=max_bytes, timeout=60) as comm:
        for _ in range(rounds):
            count = shapes.choice([1, 3, 17, 255, 1024, 3 * max_bytes // 4 + 5])
            if jitter.random() < 0.05:
                time.sleep(jitter.random() * 0.002)
            x = np.full(count, rank + 1, np.float32)
            x[::2] += 0.5
            comm.all_reduce(x, timeout=60)
            expected = np.full(count, world * (world + 1) / 2, np.float32)
            expected[::2] += 0.5 * world
            if not np.array_equal(x, expected):
                raise AssertionError(f"wrong result for count {count}: {x[:4]} vs {expected[:4]}")
            h.update(x.tobytes())
    return h.hexdigest()


def wait_in_all_reduce_until_peer_dies(group, victim: int, ready_directory: str, timeout: float):
    """Every rank builds a communicator; the victim then hangs (the test kills it),
    the others all-reduce and must raise PeerLostError within `timeout`."""
    import tensorxfer
    from tensorxfer.runtime import Communicator

    comm = Communicator(group, max_bytes=4096, timeout=60)
    x = np.ones(1000, np.float32)
    comm.all_reduce(x, timeout=60)  # everyone is in step
    open(os.path.join(ready_directory, f"ready-{group.rank}"), "w").close()
    if group.rank == victim:
        time.sleep(120)
        return "not killed"
    start = time.monotonic()
    try:
        comm.all_reduce(x, timeout=timeout)
    except tensorxfer.PeerLostError as error:
        return ("peer lost", time.monotonic() - start, str(error))
    finally:
        comm.close()
    return "no error"


def barrier_until_interrupted(directory: str, ready_path: str) -> int:
    """Builds a 2-rank communicator (rank 1 on a helper thread, which then never
    calls), waits in rank 0's barrier with no timeout; exits 42 on KeyboardInterrupt."""
    import threading

    from tensorxfer.runtime import Communicator

    comms: list = [None, None]

    def build(rank: int) -> None:
        comms[rank] = Communicator(FileGroup(directory, rank, 2), max_bytes=4096, timeout=30)

    helper = threading.Thread(target=build, args=(1,))
    helper.start()
    build(0)
    helper.join()
    open(ready_path, "w").close()
    try:
        comms[0].barrier(timeout=None)
    except KeyboardInterrupt:
        return 42
    finally:
        for comm in comms:
            comm.close()
    return 1


def _exit_with(function, *args) -> None:
    raise SystemExit(function(*args))


def join_group_and_all_reduce(group_name: str, rank: int, world: int, queue) -> None:
    """A real tensorxfer LocalGroup (joined by name) under a Communicator: sums of several sizes."""
    try:
        from tensorxfer.runtime import Communicator, LocalGroup

        with LocalGroup.join(group_name, rank=rank, world_size=world, timeout=60) as group:
            with Communicator(group, max_bytes=4096, timeout=60) as comm:
                results = []
                for count in (1, 1000, 3000):
                    x = np.full(count, rank + 1, np.float64)
                    comm.all_reduce(x, timeout=60)
                    assert np.all(x == world * (world + 1) / 2), x[:3]
                    results.append(x)
                queue.put((rank, digest(results)))
    except BaseException:
        queue.put((rank, ("error", f"rank {rank}:\n{traceback.format_exc()}")))
