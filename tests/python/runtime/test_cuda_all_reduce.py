"""CudaCommunicator: the CUDA all-reduce over IpcMemory(device="cuda").

On a GPU: two spawned processes on the one device, every dtype, op and algorithm,
chunked and not, against a reference reduced on the CPU in rank order (bitwise),
with bitwise the same bytes on both ranks; replay in a captured CUDA graph; a
mismatched call and a missing peer recorded on the GPU and raised, without a
hang. Without one: the argument checks and the reason it cannot run.
"""

from __future__ import annotations

import hashlib
import re
import time

import pytest

from collectives_workers import run_spawned
from cuda_availability import fail_if_the_core_misses_torchs_gpu

import tensorxfer
from tensorxfer import _core

torch = pytest.importorskip("torch", reason="torch is not installed (pip install .[torch])")
fail_if_the_core_misses_torchs_gpu(torch)

NO_CUDA = "no CUDA device on this machine"
DTYPES = ["float32", "float64", "bfloat16", "float16", "int32", "int64"]
OPS = ["sum", "avg", "max", "min"]
REGION = 64 << 10  # small regions, so the larger tensors go in chunks


def rank_input(rank: int, case: int, numel: int, dtype_name: str):
    """Rank `rank`'s input of case `case` (any rank can make every rank's)."""
    generator = torch.Generator().manual_seed(case * 131 + rank)
    dtype = getattr(torch, dtype_name)
    if dtype.is_floating_point:
        return (torch.randn(numel, generator=generator, dtype=torch.float64) * 100).to(dtype)
    return torch.randint(-1000, 1000, (numel,), generator=generator, dtype=dtype)


def reference(inputs: list, op: str):
    """Rank-order reduction with the host's arithmetic: halves in float32, int32 in int64."""
    dtype = inputs[0].dtype
    wide = {torch.bfloat16: torch.float32, torch.float16: torch.float32, torch.int32: torch.int64}.get(dtype, dtype)
    acc = inputs[0].to(wide)
    for value in inputs[1:]:
        value = value.to(wide)
        acc = acc + value if op in ("sum", "avg") else (torch.maximum(acc, value) if op == "max"
                                                          else torch.minimum(acc, value))
    if op == "avg" and len(inputs) > 1:
        acc = torch.div(acc, len(inputs), rounding_mode="trunc") if not wide.is_floating_point else acc / len(inputs)
    return acc.to(dtype)


def digest(tensor) -> str:
    return hashlib.sha256(tensor.cpu().view(torch.uint8).numpy().tobytes()).hexdigest()


def cases():
    index = 0
    for dtype in DTYPES:
        for op in OPS:
            for algorithm in ("one_shot", "two_shot", "auto"):
                for numel in (1, 3, 1000, 20_000):  # 20,000 float64 = 2.4 regions
                    index += 1
                    yield index, dtype, op, algorithm, numel


def reduce_every_case(group) -> list:
    from tensorxfer.runtime import CudaCommunicator

    torch.cuda.set_device(0)
    results = []
    with CudaCommunicator(group, REGION, timeout=60) as comm:
        for index, dtype, op, algorithm, numel in cases():
            inputs = [rank_input(rank, index, numel, dtype) for rank in range(group.world_size)]
            tensor = inputs[group.rank].cuda()
            comm.all_reduce(tensor, op, algorithm)
            torch.cuda.synchronize()
            comm.check()
            expected = reference(inputs, op)
            results.append((index, bool(torch.equal(tensor.cpu(), expected)), digest(tensor)))
    return results


def replay_a_captured_graph(group) -> list:
    from tensorxfer.runtime import CudaCommunicator

    torch.cuda.set_device(0)
    results = []
    with CudaCommunicator(group, REGION, timeout=60) as comm:
        static = torch.zeros(50_000, dtype=torch.float32, device="cuda")  # 3 chunks
        comm.all_reduce(static)  # warm-up outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            comm.all_reduce(static, "sum", "two_shot")
            comm.all_reduce(static, "max", "one_shot")
        for step in range(3):
            inputs = [rank_input(rank, 1000 + step, static.numel(), "float32") for rank in range(group.world_size)]
            static.copy_(inputs[group.rank])
            graph.replay()
            torch.cuda.synchronize()
            comm.check()
            summed = reference(inputs, "sum")
            results.append(bool(torch.equal(static.cpu(), summed)))
    return results


def mismatched_sizes(group) -> str:
    from tensorxfer.runtime import CudaCommunicator

    torch.cuda.set_device(0)
    with CudaCommunicator(group, REGION, timeout=20) as comm:
        tensor = torch.ones(100 + group.rank, device="cuda")
        comm.all_reduce(tensor)
        torch.cuda.synchronize()
        untouched = bool((tensor == 1).all())
        try:
            comm.check()
        except ValueError as error:
            try:
                comm.all_reduce(tensor)
            except ValueError:
                return f"{untouched} {error}"
            return "the next call did not raise"
        return "no error"


def a_peer_never_calls(group) -> str:
    from tensorxfer.runtime import CudaCommunicator

    torch.cuda.set_device(0)
    with CudaCommunicator(group, REGION, timeout=2) as comm:
        if group.rank == 1:
            time.sleep(3)  # reaches close()'s barrier about when rank 0 has given up
            return "idle"
        tensor = torch.ones(10, device="cuda")
        start = time.monotonic()
        comm.all_reduce(tensor)
        torch.cuda.synchronize()
        seconds = time.monotonic() - start
        try:
            comm.check()
        except TimeoutError as error:
            return f"{seconds:.1f} {error}"
        return "no error"


@pytest.mark.cuda
@pytest.mark.multiprocess
@pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA)
class TestOnOneGpu:
    @pytest.mark.timeout(330)  # above the launch's own 300 s
    def test_every_dtype_op_and_algorithm_matches_the_rank_order_reference_on_every_rank(self, tmp_path):
        ranks = run_spawned(2, reduce_every_case, (), str(tmp_path), timeout=300)
        wrong = [(index, dtype) for (index, equal, _), (_, dtype, *_rest) in zip(ranks[0], cases()) if not equal]
        assert wrong == [], f"rank 0 differs from the reference in cases {wrong[:10]}"
        assert all(equal for _, equal, _ in ranks[1])
        assert [d for _, _, d in ranks[0]] == [d for _, _, d in ranks[1]], "the ranks' results differ"

    def test_a_captured_graph_replays_with_fresh_barriers(self, tmp_path):
        ranks = run_spawned(2, replay_a_captured_graph, (), str(tmp_path), timeout=120)
        # The graph sums, then takes the max of two equal tensors: the sum again.
        assert ranks == [[True] * 3, [True] * 3]

    def test_a_mismatched_call_is_raised_on_every_rank_and_touches_nothing(self, tmp_path):
        ranks = run_spawned(2, mismatched_sizes, (), str(tmp_path), timeout=120)
        for rank, outcome in enumerate(ranks):
            assert outcome.startswith("True CudaAllReduce: rank"), outcome
            assert f"rank {1 - rank} called all_reduce with another" in outcome

    def test_a_peer_that_never_calls_is_a_timeout_not_a_hang(self, tmp_path):
        ranks = run_spawned(2, a_peer_never_calls, (), str(tmp_path), timeout=120)
        seconds, message = ranks[0].split(" ", 1)
        assert 1.5 < float(seconds) < 30, ranks[0]
        assert "waited more than 2 s for rank 1" in message and ranks[1] == "idle"


def test_without_a_device_it_says_why(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: see TestOnOneGpu")
    from collectives_workers import FileGroup
    from tensorxfer.runtime import CudaCommunicator

    with pytest.raises(tensorxfer.UnsupportedError, match=r"no CUDA device \(torch.cuda.is_available\(\) is False\)"):
        CudaCommunicator(FileGroup(str(tmp_path), 0, 1))


@pytest.mark.parametrize("arguments, message", [
    ({"max_bytes": 4}, "^max_bytes: expected an integer >= 8, got 4$"),
    ({"timeout": 0}, r"timeout must be a number of seconds in \(0, 1e6\], got 0"),
    ({"timeout": None}, "timeout must be a number of seconds"),
])
def test_arguments_are_checked_before_anything_is_made(tmp_path, arguments, message):
    from collectives_workers import FileGroup
    from tensorxfer.runtime import CudaCommunicator

    with pytest.raises(ValueError, match=message):
        CudaCommunicator(FileGroup(str(tmp_path), 0, 1), **arguments)


@pytest.mark.skipif(not hasattr(_core, "CudaAllReduce"), reason="this extension was built without CUDA")
def test_the_native_object_checks_its_peers_before_calling_cuda():
    before = _core.cuda_runtime_calls()
    base = dict(rank=0, world_size=2, cuda_device=0, data=[4096, 8192], barrier_in=[64, 128],
                barrier_out=[256, 512], data_nbytes=1024, timeout=1.0)
    refusals = [
        (dict(world_size=17, data=[1] * 17, barrier_in=[1] * 17, barrier_out=[1] * 17),
         r"world_size must be in \[1, 16\], got 17"),
        (dict(rank=2), r"rank must be in \[0, 2\), got 2"),
        (dict(data=[4096]), r"one address per rank \(2\), got 1, 2 and 2"),
        (dict(barrier_out=[256, 0]), "rank 1's region or barrier words are not mapped"),
        (dict(data_nbytes=4), "data_nbytes must be >= 8, got 4"),
        (dict(timeout=0.0), r"timeout must be in \(0, 1e6\] seconds"),
    ]
    for change, message in refusals:
        try:
            _core.CudaAllReduce(**{**base, **change})
        except tensorxfer.UnsupportedError as error:  # a build without the kernels refuses everything
            assert "no CUDA kernels" in str(error)
            continue
        except ValueError as error:
            assert re.search(message, str(error)), (message, str(error))
            continue
        raise AssertionError(f"{change} was accepted")
    assert _core.cuda_runtime_calls() == before
