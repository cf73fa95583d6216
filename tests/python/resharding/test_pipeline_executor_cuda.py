"""The CUDA pipeline executor (DoubleBufferManager(device="cuda") + CudaKernelLauncher).

On a GPU: two spawned ranks on the one device move random tasks (self-moves
included, odd sizes and offsets, several rounds) with the schedule the host
executor runs, and land bitwise what the host executor lands from the same
bytes, without touching bytes outside the tasks; set_streams / set_events are
honoured (the caller's events are recorded; a pair naming two streams is
refused); _launch_pack fills the send slot; a peer that never comes makes the
other rank raise within its timeout. Without a GPU: the span tables (Hypothesis),
the plan checks without an executor, and the refusals that need no device.
"""

from __future__ import annotations

import json
import multiprocessing
import random
import time
import uuid

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tensorxfer import _core
from tensorxfer.errors import UnsupportedError
from tensorxfer.resharding.cuda_pipeline import CudaKernelLauncher, span_rows, split_spans
from tensorxfer.resharding.pipeline_executor import DoubleBufferManager, HostKernelLauncher, PipelineExecutor
from tensorxfer.resharding.schedule import BatchTask, ReceiveRequest, ScheduledBatch, SendRequest, build_schedule
from tensorxfer.runtime import LocalGroup

torch = pytest.importorskip("torch", reason="torch is not installed (pip install .[torch])")

HAS_GPU = torch.cuda.is_available() and hasattr(_core, "cuda_copy_spans")
NO_GPU = "no CUDA device on this machine (or a build without CUDA)"
SLOT = 8192


# ---- without a GPU -------------------------------------------------------------------------------

@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1 << 40), st.integers(0, 1 << 40), st.integers(0, 200_000)), max_size=8),
       st.sampled_from([1000, 4096, 65536]))
def test_split_spans_cut_each_span_into_pieces_in_order(spans, piece):
    source, destination, sizes = (np.array([span[k] for span in spans], np.uint64) for k in range(3))
    rows = split_spans(source, destination, sizes, piece)
    expected = [(s + k, d + k, min(piece, n - k)) for s, d, n in spans for k in range(0, n, piece)]
    assert rows.dtype == np.uint64 and rows.shape == (len(expected), 3)
    assert [tuple(row) for row in rows.tolist()] == expected


def test_span_rows_map_tasks_and_slot_both_ways():
    segments = np.array([[7, 10, 20, 64], [3, 0, 5, 0]], np.uint64)
    memory = np.array([[3, 1000, 5], [7, 2000, 40]], np.uint64)
    packing = span_rows(segments, memory, 50_000, True, 65536)
    assert packing.tolist() == [[2010, 50_064, 20], [1000, 50_000, 5]]
    unpacking = span_rows(segments, memory, 50_000, False, 8)
    assert unpacking.tolist() == [[50_064, 2010, 8], [50_072, 2018, 8], [50_080, 2026, 4], [50_000, 1000, 5]]


def test_plan_checks_without_an_executor_name_the_field():
    plan = _core.PipelinePlan.from_iterations([(
        (0, 1, 0, 0, 104, np.array([[5, 40, 20, 0]], np.uint64)), None)])
    ids, addresses, sizes = (np.array([5], np.uint64), np.array([4096], np.uint64), np.array([50], np.uint64))
    empty = np.zeros(0, np.uint64)
    with pytest.raises(ValueError, match="task_offset 40 \\+ size 20 exceeds the task's 50 bytes"):
        _core.check_pipeline_plan(plan, ids, addresses, sizes, empty, empty, empty, my_pe=0, world_size=2,
                                  slot_nbytes=4096)
    with pytest.raises(ValueError, match="dest_pe must be another rank of the group"):
        _core.check_pipeline_plan(plan, ids, addresses, sizes, empty, empty, empty, my_pe=0, world_size=1,
                                  slot_nbytes=4096)
    with pytest.raises(ValueError, match="total_size 104 exceeds the slot's 64 bytes"):
        _core.check_pipeline_batch((0, 1, 0, 0, 104, np.array([[5, 0, 20, 0]], np.uint64)), True, ids, addresses,
                                   sizes, my_pe=0, world_size=2, slot_nbytes=64)


def test_a_cuda_launcher_needs_cuda_buffers_and_cuda_tensors():
    group = LocalGroup.join(f"cuda-pipeline-{uuid.uuid4().hex[:8]}", rank=0, world_size=1, timeout=20)
    try:
        buffers = DoubleBufferManager(group, slot_nbytes=4096, timeout=20)
        with pytest.raises(ValueError, match="needs a HostKernelLauncher, got CudaKernelLauncher"):
            PipelineExecutor(CudaKernelLauncher(device=0), buffers, 0)
        executor = PipelineExecutor(HostKernelLauncher(), buffers, 0)
        with pytest.raises(UnsupportedError, match="DoubleBufferManager\\(device='cuda'\\)"):
            executor.set_events([object(), object()], None)
        buffers.close()
    finally:
        group.close()
    with pytest.raises(ValueError, match="must be a torch tensor on cuda:0"):
        CudaKernelLauncher([SendRequest(1, torch.zeros(8, dtype=torch.uint8), 0, 8, 0)], [], device=0)


@pytest.mark.skipif(HAS_GPU, reason="a CUDA device is present (the GPU tests below run instead)")
def test_cuda_buffers_without_a_device_say_why():
    group = LocalGroup.join(f"cuda-pipeline-{uuid.uuid4().hex[:8]}", rank=0, world_size=1, timeout=20)
    try:
        with pytest.raises(UnsupportedError, match="no CUDA device|needs torch"):
            DoubleBufferManager(group, slot_nbytes=4096, timeout=20, device="cuda")
    finally:
        group.close()


# ---- on a GPU: spawned ranks ---------------------------------------------------------------------

def _tasks(world: int, seed: int):
    rng = random.Random(seed)
    return [(task_id, rng.choice([1, 3, 100, 4096, 5000, 20_000, 70_000]), rng.randrange(world), rng.randrange(world))
            for task_id in range(40)]


def _content(task_id: int, size: int, round_: int) -> np.ndarray:
    return ((np.arange(size, dtype=np.int64) * 7 + task_id * 131 + round_ * 29) % 251).astype(np.uint8)


def _requests(rank, tasks, make):
    """Send and receive requests of this rank over tensors from make(nbytes) (sources at byte 8, targets at 16)."""
    sends, receives, inbox = [], [], {}
    for task_id, size, src, dst in tasks:
        if src == rank:
            sends.append(SendRequest(task_id, make(size + 16), 8, size, dst))
        if dst == rank:
            inbox[task_id] = make(size + 33)
            receives.append(ReceiveRequest(task_id, inbox[task_id], 16, size, src))
    return sends, receives, inbox


def _schedule(group, rank, world, sends, receives):
    rows = [[(r.task_id, r.size, rank, r.dest_pe) for r in sends], [(r.task_id, r.size, r.src_pe, rank) for r in receives]]
    all_sends, all_recvs = [], []
    for data in group.all_gather_bytes(json.dumps(rows).encode(), timeout=60):
        theirs = json.loads(data.decode())
        all_sends += theirs[0]
        all_recvs += theirs[1]
    return build_schedule(all_sends, all_recvs, world, slot_nbytes=SLOT, max_tasks_per_batch=8)


def _move_every_byte(group, rank, world):
    torch.cuda.set_device(0)
    tasks = _tasks(world, seed=11)
    schedule = _schedule(group, rank, world, *_requests(rank, tasks, lambda n: np.zeros(n, np.uint8))[:2])
    host = _requests(rank, tasks, lambda n: np.zeros(n, np.uint8))
    gpu = _requests(rank, tasks, lambda n: torch.zeros(n, dtype=torch.uint8, device="cuda"))
    host_executor = PipelineExecutor(HostKernelLauncher(host[0], host[1]), DoubleBufferManager(group, SLOT, timeout=60), rank)
    cuda_buffers = DoubleBufferManager(group, SLOT, timeout=60, device="cuda")
    executor = PipelineExecutor(CudaKernelLauncher(gpu[0], gpu[1]), cuda_buffers, rank)
    streams = [torch.cuda.Stream() for _ in range(3)]
    events = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
    report = {"iterations": schedule.num_iterations, "rounds": 0}
    for round_ in range(4):
        if round_ == 2:  # the caller's streams and events from here on
            executor.set_streams(streams[0], streams[1], streams[2], None, None, None, None)
            executor.set_events(events[:2], events[2:])
            start = torch.cuda.Event(enable_timing=True)
            start.record()
        for (host_send, gpu_send) in zip(host[0], gpu[0]):
            content = _content(host_send.task_id, host_send.size, round_)
            host_send.src_tensor[8:8 + host_send.size] = content
            gpu_send.src_tensor[8:8 + gpu_send.size].copy_(torch.from_numpy(content))  # on torch's stream
        for one, (sends, receives, _) in ((host_executor, host), (executor, gpu)):
            one.process_self_moves(sends, receives)
            one.execute_pipeline(schedule.iteration_schedules(rank), schedule.num_iterations, timeout=60)
        for task_id, size, src, dst in tasks:
            if dst != rank:
                continue
            landed = gpu[2][task_id].cpu().numpy()
            if not np.array_equal(landed, host[2][task_id]):
                raise AssertionError(f"round {round_}: task {task_id} from rank {src}: the CUDA and host executors "
                                     "landed different bytes")
            if not np.array_equal(landed[16:16 + size], _content(task_id, size, round_)) or landed[:16].any() \
                    or landed[16 + size:].any():
                raise AssertionError(f"round {round_}: task {task_id} from rank {src} differs or spilled")
        report["rounds"] += 1
    torch.cuda.synchronize()
    report["events_recorded"] = all(start.elapsed_time(event) >= 0 for event in events)  # raises if never recorded
    try:
        executor.set_streams(pack_stream=streams[0], torch_pack_stream=streams[1])
        report["pair"] = "accepted"
    except ValueError as error:
        report["pair"] = str(error)
    cuda_buffers.close()
    host_executor.buffer_manager.close()
    return report


def _pack_fills_the_send_slot(group, rank, world):
    torch.cuda.set_device(0)
    source = torch.arange(300, dtype=torch.int32, device="cuda").to(torch.uint8)
    buffers = DoubleBufferManager(group, 4096, timeout=60, device="cuda")
    executor = PipelineExecutor(CudaKernelLauncher([SendRequest(5, source, 100, 50, 1 - rank)], []), buffers, rank)
    executor._launch_pack(1, ScheduledBatch(rank, 1 - rank, 0, 1, [BatchTask(5, 10, 40, 64)], 104))
    executor.synchronize()
    slot = buffers.send_slot(1).cpu()
    result = (bool(torch.equal(slot[64:104], source[110:150].cpu())), int(slot[:64].count_nonzero()),
              int(buffers.send_slot(0).count_nonzero()))
    try:
        executor._launch_pack(0, ScheduledBatch(rank, 1 - rank, 0, 0, [BatchTask(5, 40, 20, 0)], 20))
        refused = "no error"
    except ValueError as error:
        refused = str(error)
    group.barrier(timeout=60)
    buffers.close()
    return result, refused


def _a_peer_never_comes(group, rank, world):
    torch.cuda.set_device(0)
    buffers = DoubleBufferManager(group, 4096, timeout=60, device="cuda")
    target = torch.zeros(64, dtype=torch.uint8, device="cuda")
    source = torch.ones(64, dtype=torch.uint8, device="cuda")
    launcher = CudaKernelLauncher([SendRequest(1, source, 0, 64, 1 - rank)], [ReceiveRequest(1, target, 0, 64, 1 - rank)])
    executor = PipelineExecutor(launcher, buffers, rank)
    batch = ScheduledBatch(0, 1, 0, 0, [BatchTask(1, 0, 64, 0)], 64)
    steps = [{"send": batch, "recv": None}] if rank == 0 else [{"send": None, "recv": batch}]
    if rank == 1:
        time.sleep(6)
        return "idle"
    start = time.monotonic()
    try:
        executor.execute_pipeline(steps, 1, timeout=2, agree=False)
        return "no error"
    except TimeoutError as error:
        return f"{time.monotonic() - start:.1f} {error}"


def _rank_main(target, name, rank, world, queue):
    try:
        group = LocalGroup.join(name, rank=rank, world_size=world, timeout=60)
        try:
            queue.put((rank, target(group, rank, world)))
        finally:
            group.close()
    except BaseException as error:
        queue.put((rank, f"error {type(error).__name__}: {error}"))


def on_gpu(test):
    """Marks a test of spawned ranks on the GPU (cuda, multiprocess; skipped without a device), with a
    pytest timeout above _spawn's own deadline, so that a hang is reported by _spawn."""
    return pytest.mark.timeout(270)(
        pytest.mark.cuda(pytest.mark.multiprocess(pytest.mark.skipif(not HAS_GPU, reason=NO_GPU)(test))))


def _spawn(target, world=2, timeout=240):
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    name = f"cuda-pipeline-{uuid.uuid4().hex[:8]}"
    processes = [context.Process(target=_rank_main, args=(target, name, rank, world, queue)) for rank in range(world)]
    for process in processes:
        process.start()
    deadline = time.monotonic() + timeout  # one deadline for every rank's report
    try:
        return dict(queue.get(timeout=max(0.1, deadline - time.monotonic())) for _ in processes)
    finally:
        for process in processes:
            process.join(30)
            if process.is_alive():
                process.kill()


@on_gpu
def test_two_ranks_on_one_gpu_land_what_the_host_executor_lands():
    results = _spawn(_move_every_byte)
    for rank in range(2):
        report = results[rank]
        assert isinstance(report, dict), f"rank {rank}: {report}"
        assert report["rounds"] == 4 and report["iterations"] >= 2
        assert report["events_recorded"], "the caller's events were not recorded"
        assert "must be the same CUDA stream" in report["pair"]


@on_gpu
def test_launch_pack_fills_the_cuda_send_slot_and_checks_the_batch():
    results = _spawn(_pack_fills_the_send_slot)
    for rank in range(2):
        assert not isinstance(results[rank], str), f"rank {rank}: {results[rank]}"
        (equal, head, other), refused = results[rank]
        assert equal and head == 0 and other == 0
        assert "task_offset 40 + size 20 exceeds the task's 50 bytes" in refused


@on_gpu
def test_a_missing_peer_is_a_timeout_not_a_hang():
    results = _spawn(_a_peer_never_comes)
    assert results[1] == "idle"
    waited, _, message = results[0].partition(" ")
    assert waited != "no" and float(waited) < 10, results[0]
