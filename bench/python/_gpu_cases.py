"""The CUDA cases of ``bench_gpu.py``: replay transfer, unified memory, the pipeline executor and the
CUDA all-reduce, each beside its baseline and its floor, interleaved, medians of repeated samples.

Every device operation goes through a ``Gpu`` of ``_gpu_machines.py`` (a real GPU through torch.cuda,
or the fake CUDA runtime with stand-ins), so the same case code runs here and on a lent machine.
"""

from __future__ import annotations

import multiprocessing
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _gpu_machines import FAKE, FakeGpu, make_gpu  # noqa: E402  (first: it may load the fake extension)
from _report import Report, time_interleaved  # noqa: E402

MiB = 1 << 20
FAKE_NOTE = ("fake CUDA runtime (tests/cuda_fake) and a CPU-only torch: 'device' memory is host memory and "
             "torch-level CUDA classes are stand-ins; every number of this case is meaningless")


def size_name(nbytes: int) -> str:
    for shift, unit in ((30, "GiB"), (20, "MiB"), (10, "KiB")):
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} B"


def new_report(title: str, gpu: Any, config: Dict[str, Any]) -> Report:
    report = Report(title, {**config, "gpu": gpu.name, "fake_cuda": gpu.fake})
    if gpu.fake:
        report.note(FAKE_NOTE)
    return report


def add_times(report: Report, case: str, samples: Dict[str, List[float]], nbytes: int) -> None:
    """Each variant's time per call (ms) and bandwidth (GB/s of ``nbytes`` per call)."""
    for name, seconds in samples.items():
        report.add(case, name, "time", [s * 1e3 for s in seconds], "ms", lower_is_better=True)
        report.add(case, name, "bandwidth", [nbytes / s / 1e9 for s in seconds], "GB/s", lower_is_better=False)


# ---- replay transfer --------------------------------------------------------------------------

REPLAY_BACKEND = "tensorxfer cuda backend"
REPLAY_TORCH_COPY = "TorchCopyReplayTransferBackend"
REPLAY_FLOOR = "floor: pinned cudaMemcpyAsync"


def replay_case(sizes: List[int], batches: int, repeats: int) -> Report:
    """``batches`` packed batches back to back from two SlotRing slots into two device slots, per size."""
    from tensorxfer.ipc import SlotRing

    gpu = make_gpu()
    torch = gpu.torch
    report = new_report("replay transfer: SlotRing slot -> GPU, back to back", gpu,
                        {"sizes": sizes, "batches": batches, "repeats": repeats})
    largest = max(sizes)
    # One ring per backend: the CUDA backend pins its slots in place, a torch-copy user's stay pageable.
    rings = {REPLAY_BACKEND: SlotRing.create(2, largest), REPLAY_TORCH_COPY: SlotRing.create(2, largest)}
    backends = {REPLAY_BACKEND: gpu.replay_backend(2), REPLAY_TORCH_COPY: gpu.torch_copy_backend(2)}
    try:
        slots = {name: [ring.slot_tensor(slot) for slot in range(2)] for name, ring in rings.items()}
        targets = {}
        for name, backend in backends.items():
            for slot in slots[name]:
                slot.fill_(3)
            backend.register_host_slots(slots[name])
            targets[name] = backend.allocate_device_slots(count=2, shape=(largest,), dtype=torch.uint8)
        pinned, pageable, device = gpu.pinned(largest), torch.full((largest,), 3, dtype=torch.uint8), gpu.empty(largest)
        pinned.fill_(3)
        for nbytes in sizes:
            def through(name: str, nbytes: int = nbytes) -> Callable[[], None]:
                backend, target, sources = backends[name], targets[name], slots[name]

                def run() -> None:
                    for batch in range(batches):
                        slot = batch % 2
                        backend.submit_h2d(slot=slot, dst=target[slot], src=sources[slot], h2d_bytes=nbytes)
                    backend.synchronize_ready(0)
                    backend.synchronize_ready(1)
                return run

            def to_device(source: Any, nbytes: int = nbytes) -> Callable[[], None]:
                def run() -> None:
                    for _ in range(batches):
                        gpu.to_device(source[:nbytes])
                    gpu.synchronize()
                return run

            def floor(nbytes: int = nbytes) -> None:
                for _ in range(batches):
                    gpu.memcpy_h2d(device, pinned, nbytes)
                gpu.synchronize()

            variants = {name: through(name) for name in backends}
            variants.update({"torch .to(cuda, non_blocking) from pinned": to_device(pinned),
                             "torch .to(cuda, non_blocking) from pageable": to_device(pageable),
                             REPLAY_FLOOR: floor})
            for name in backends:  # every byte arrives
                targets[name][0].zero_()
                variants[name]()
                if not bool((targets[name][0][:nbytes] == 3).all()):
                    raise AssertionError(f"replay: {name} did not copy the bytes ({size_name(nbytes)})")
            samples = time_interleaved(variants, repeats)
            case = f"{size_name(nbytes)} x {batches} batches"
            add_times(report, case, {k: [s / batches for s in v] for k, v in samples.items()}, nbytes)
            for baseline in list(variants)[1:-1]:
                report.compare(case, "time", REPLAY_BACKEND, baseline)
            report.compare(case, "bandwidth", REPLAY_BACKEND, REPLAY_FLOOR, target=0.9 if nbytes >= 16 * MiB else None)
        report.note(f"replay: h2d_submitter {getattr(backends[REPLAY_BACKEND], 'h2d_submitter', '?')}; "
                    "times are per batch; the floor is one cudaMemcpyAsync per batch from a pinned buffer")
    finally:
        for backend in backends.values():
            backend.close()
        gpu.close()
        for ring in rings.values():
            ring.close()
    return report


# ---- unified memory ---------------------------------------------------------------------------

UM_PREFETCH = "tensorxfer prefetch_managed_module_parameters"
UM_FLOOR = "floor: pinned copy"


def unified_memory_case(nbytes: int, repeats: int) -> Report:
    """A module of ``nbytes`` of parameters in the UVM pool prefetched to the CPU and back, against
    ``module.to``; first touch on the GPU with and without prefetch and advice; the pinned-copy floor."""
    from tensorxfer.inference import unified_memory as um

    gpu = make_gpu()
    report = new_report("unified memory: module prefetch and first touch", gpu,
                        {"bytes": nbytes, "repeats": repeats})
    pieces = 16
    managed, pool = gpu.managed_module(nbytes, pieces)
    plain = gpu.plain_module(nbytes, pieces)
    pinned, device = gpu.pinned(nbytes), gpu.empty(nbytes)
    samples: Dict[str, List[float]] = {}

    def timed(name: str, action: Callable[[], Any]) -> None:
        gpu.synchronize()
        begin = time.perf_counter()
        action()
        gpu.synchronize()
        samples.setdefault(name, []).append(time.perf_counter() - begin)

    def prefetch_round() -> None:
        timed(f"{UM_PREFETCH}|to CPU", lambda: um.prefetch_managed_module_parameters(managed, device=-1))
        timed(f"{UM_PREFETCH}|to GPU", lambda: um.prefetch_managed_module_parameters(managed, device=0))

    def to_round() -> None:
        timed("module.to|to CPU", lambda: gpu.module_to(plain, "cpu"))
        timed("module.to|to GPU", lambda: gpu.module_to(plain, "gpu"))

    def floor_round() -> None:
        timed(f"{UM_FLOOR}|to CPU", lambda: pinned.copy_(device, non_blocking=True))
        timed(f"{UM_FLOOR}|to GPU", lambda: device.copy_(pinned, non_blocking=True))

    def first_touch(kind: str) -> Callable[[], None]:
        def run() -> None:
            tensor = gpu.managed_tensor(pool, nbytes)
            um.prefetch_managed_tensor(tensor, device=-1)  # its pages start on the CPU, whatever the pool reused
            gpu.synchronize()

            def touch() -> None:
                if kind != "no prefetch":
                    if kind == "prefetch + advice":
                        um.advise_managed_tensor_preferred_location(tensor, device=0)
                        um.advise_managed_tensor_accessed_by(tensor, device=0)
                    um.prefetch_managed_tensor(tensor, device=0)
                gpu.first_touch(tensor)
            timed(f"first touch on the GPU, {kind}|touch", touch)
        return run

    rounds = [prefetch_round, to_round, floor_round] + [first_touch(k) for k in
                                                          ("no prefetch", "prefetch", "prefetch + advice")]
    for round_function in rounds:  # warm up
        round_function()
    samples.clear()
    for repeat in range(repeats):
        shift = repeat % len(rounds)
        for round_function in rounds[shift:] + rounds[:shift]:
            round_function()
    case = f"{size_name(nbytes)} of parameters"
    for key, seconds in samples.items():
        variant, direction = key.split("|")
        this_case = case if direction != "touch" else f"{size_name(nbytes)} first touch"
        metric = direction if direction != "touch" else "touch"
        report.add(this_case, variant, f"{metric} ms", [s * 1e3 for s in seconds], "ms", lower_is_better=True)
        report.add(this_case, variant, f"{metric} GB/s", [nbytes / s / 1e9 for s in seconds], "GB/s",
                   lower_is_better=False)
    for direction in ("to CPU", "to GPU"):
        report.compare(case, f"{direction} ms", UM_PREFETCH, "module.to")
        report.compare(case, f"{direction} GB/s", UM_PREFETCH, UM_FLOOR, target=0.8)
    touch_case = f"{size_name(nbytes)} first touch"
    for kind in ("prefetch", "prefetch + advice"):
        report.compare(touch_case, "touch ms", f"first touch on the GPU, {kind}", "first touch on the GPU, no prefetch")
    report.note("unified memory: first touch starts with the tensor's pages on the CPU (prefetched there); "
                "'prefetch' variants include the prefetch in their time")
    gpu.close()
    return report


# ---- CUDA all-reduce: two processes on the one GPU ---------------------------------------------

AR_TENSORXFER = "tensorxfer CudaCommunicator"
AR_TORCH_SUM = "torch sum of the two inputs (one process)"
AR_COPY = "device copy of the same bytes (one process)"
AR_FLOOR = "floor: memory bandwidth for the bytes read and written"
#: Per rank the all-reduce reads both inputs and writes its output: 3 x n bytes, 6 x n for the two
#: processes on the one GPU; a device copy of n bytes reads and writes 2 x n.
AR_FLOOR_COPIES = 3


def all_reduce_rank(rank: int, name: str, config: Dict[str, Any], queue: Any) -> None:
    try:
        queue.put((rank, "ok", _all_reduce_rank(rank, name, config)))
    except BaseException as error:  # reported by the launcher
        import traceback

        queue.put((rank, "error", f"rank {rank}: {error!r}\n{traceback.format_exc()}"))


def _all_reduce_rank(rank: int, name: str, config: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    from tensorxfer.runtime import LocalGroup

    gpu = make_gpu()
    torch = gpu.torch
    group = LocalGroup.join(name, rank=rank, world_size=2, timeout=120)
    comm = gpu.communicator(group)
    results: Dict[str, Any] = {}
    try:
        for dtype_name in config["dtypes"]:
            dtype = getattr(torch, dtype_name)
            for nbytes in config["sizes"]:
                count = nbytes // torch.empty((), dtype=dtype).element_size()
                tensor = gpu.empty(count, dtype)
                tensor.fill_(rank + 1)
                comm.all_reduce(tensor)
                gpu.synchronize()
                if float(tensor[-1]) != 3.0:
                    raise AssertionError(f"all-reduce {dtype_name} {nbytes} B: got {float(tensor[-1])}, expected 3")
                calls = max(2, min(config["max_calls"], (64 * MiB) // nbytes))
                inputs = [gpu.empty(count, dtype).fill_(1), gpu.empty(count, dtype).fill_(2)]
                total, source, target = gpu.empty(count, dtype), gpu.empty(nbytes), gpu.empty(nbytes)

                def collective() -> None:
                    for _ in range(calls):
                        comm.all_reduce(tensor)
                    gpu.synchronize()

                def torch_sum() -> None:
                    for _ in range(calls):
                        torch.add(inputs[0], inputs[1], out=total)
                    gpu.synchronize()

                def copy() -> None:
                    for _ in range(calls):
                        target.copy_(source)
                    gpu.synchronize()

                variants = {AR_TENSORXFER: (collective, True), AR_TORCH_SUM: (torch_sum, False),
                            AR_COPY: (copy, False)}
                names = list(variants)
                samples: Dict[str, List[float]] = {key: [] for key in names}
                for repeat in range(config["repeats"] + 1):  # the first round warms up
                    shift = repeat % len(names)
                    for key in names[shift:] + names[:shift]:
                        run, both = variants[key]
                        group.barrier(timeout=120)
                        if not both and rank != 0:
                            continue
                        begin = time.perf_counter()
                        run()
                        if repeat:
                            samples[key].append((time.perf_counter() - begin) / calls)
                results[f"{dtype_name}/{nbytes}"] = samples
        group.barrier(timeout=120)
    finally:
        comm.close()
        group.close()
        gpu.close()
    return results if rank == 0 else None


def all_reduce_case(sizes: List[int], dtypes: List[str], repeats: int, max_calls: int, timeout: float) -> Report:
    gpu_name = FakeGpu.name if FAKE else _torch_device_name()
    report = Report("CUDA all-reduce: 2 processes on the one GPU, back to back",
                    {"sizes": sizes, "dtypes": dtypes, "repeats": repeats, "gpu": gpu_name, "fake_cuda": FAKE})
    if FAKE:
        report.note(FAKE_NOTE + " (the all-reduce is the host Communicator's over a fake CUDA IpcMemory)")
    config = {"sizes": sizes, "dtypes": dtypes, "repeats": repeats, "max_calls": max_calls}
    outcome = launch_two_ranks(all_reduce_rank, f"bench-gpu-ar-{uuid.uuid4().hex[:8]}", config, timeout)
    for key, samples in outcome.items():
        dtype_name, nbytes = key.split("/")[0], int(key.split("/")[1])
        case = f"{dtype_name} {size_name(int(nbytes))}"
        for variant, seconds in samples.items():
            report.add(case, variant, "time", [s * 1e6 for s in seconds], "us", lower_is_better=True)
        copy_us = [s * 1e6 * AR_FLOOR_COPIES for s in samples[AR_COPY]]
        report.add(case, AR_FLOOR, "time", copy_us, "us", lower_is_better=True)
        report.compare(case, "time", AR_TENSORXFER, AR_TORCH_SUM)
        report.compare(case, "time", AR_TENSORXFER, AR_FLOOR, target=0.5 if nbytes >= 64 * MiB else None)
    report.note(f"CUDA all-reduce: the floor is {AR_FLOOR_COPIES} device copies of the tensor's bytes (each "
                "reads and writes n bytes): the 6 n bytes the two ranks read and write at least, at the copy's "
                "bandwidth measured in the same loop; target: within 2x of it at 64 MiB (ratio >= 0.5)")
    return report


def launch_two_ranks(target: Callable[..., None], name: str, config: Dict[str, Any], timeout: float) -> Any:
    """Runs ``target(rank, name, config, queue)`` in two spawned processes; rank 0's payload."""
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    processes = [context.Process(target=target, args=(rank, name, config, queue)) for rank in range(2)]
    for process in processes:
        process.start()
    try:
        outcome: Dict[int, Any] = {}
        deadline = time.monotonic() + timeout
        while len(outcome) < 2:
            rank, status, payload = queue.get(timeout=max(1.0, deadline - time.monotonic()))
            if status != "ok":
                raise RuntimeError(payload)
            outcome[rank] = payload
    finally:
        for process in processes:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()
                process.join()
    return outcome[0]


def _torch_device_name() -> str:
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("torch.cuda.is_available() is False: no GPU (use --fake-cuda to test the script)")
    return torch.cuda.get_device_name(0)


# ---- pipeline executor (bench_cuda_pipeline.py's ranks) -----------------------------------------

PIPELINE_UNAVAILABLE_ON_FAKE = ("the CUDA pipeline executor needs torch.cuda streams and events and the span-copy "
                                "kernels, which a CPU-only torch and the fake build (no CUDA kernels) lack")


def pipeline_case(repeats: int, timeout: float) -> Report:
    """bench_cuda_pipeline.py's two ranks (10,000 x 4 KiB, 1000 x 64 KiB, 16 x 16 MiB), one run."""
    if FAKE:
        raise Unavailable(PIPELINE_UNAVAILABLE_ON_FAKE)
    import queue as queue_module

    import bench_cuda_pipeline as pipeline

    report = Report("pipeline executor: 2 processes on the one GPU (bench_cuda_pipeline.py)",
                    {"repeats": repeats, "gpu": _torch_device_name(), "cases": pipeline.CASES})
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    name = f"bench-gpu-pipeline-{uuid.uuid4().hex[:8]}"
    processes = [context.Process(target=pipeline._rank, args=(name, rank, repeats, results)) for rank in range(2)]
    for process in processes:
        process.start()
    try:
        outcome: Dict[int, Any] = {}
        deadline = time.monotonic() + timeout
        while len(outcome) < 2:
            try:
                rank, payload = results.get(timeout=5)
                outcome[rank] = payload
            except queue_module.Empty:
                dead = [p.exitcode for p in processes if p.exitcode not in (None, 0)]
                if dead or time.monotonic() > deadline:
                    raise RuntimeError(f"pipeline ranks failed (exit codes {[p.exitcode for p in processes]})"
                                       if dead else f"pipeline ranks timed out after {timeout:.0f} s") from None
    finally:
        for process in processes:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()
                process.join()
    rank0 = outcome[0]
    names = {"executor": "tensorxfer PipelineExecutor", "same steps (torch)": "same steps in torch",
             "torch copies": "per-tensor copy_", "floor": "floor: one device-to-device copy"}
    for label, _count, size in pipeline.CASES:
        for key, variant in names.items():
            cell = rank0[f"{label}|{key}"]
            report.add(label, variant, "time", [cell["p10"], cell["median"], cell["p90"]], "ms",
                       lower_is_better=True, value=cell["median"])
        report.compare(label, "time", names["executor"], names["same steps (torch)"])
        report.compare(label, "time", names["executor"], names["torch copies"])
        report.compare(label, "time", names["executor"], names["floor"], target=0.7 if size >= 16 * MiB else None)
    report.note("pipeline: rank 0's times; samples shown as p10, median, p90 of bench_cuda_pipeline.py's repeats")
    return report


class Unavailable(RuntimeError):
    """A case that cannot run on this machine; the message says why (a skip, not a failure)."""
