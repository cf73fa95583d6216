"""Host paths never touch CUDA: in a forked worker (where touching a CUDA context
the parent may hold is an error), prefetch/advise to the CPU and the host replay
backend leave torch.cuda uninitialised and make no CUDA runtime call, neither
through torch nor through tensorxfer's core (counted by _core.cuda_runtime_calls)."""

from __future__ import annotations

import multiprocessing

import numpy as np
import pytest

from tensorxfer import _core

torch = pytest.importorskip("torch", reason="torch is not installed (pip install .[torch])")

# torch.cuda entry points that query or initialise the CUDA runtime.
TORCH_CUDA_ENTRY_POINTS = [
    ("torch.cuda", "is_available"), ("torch.cuda", "device_count"), ("torch.cuda", "current_device"),
    ("torch.cuda", "current_stream"), ("torch.cuda", "default_stream"), ("torch.cuda", "init"),
    ("torch.cuda", "_lazy_init"), ("torch.cuda", "synchronize"), ("torch.cuda", "set_device"),
    ("torch.cuda", "Stream"), ("torch.cuda", "Event"), ("torch.cuda", "cudart"),
    ("torch._C", "_cuda_getDeviceCount"), ("torch._C", "_cuda_init"),
]


def _record_torch_cuda_calls(calls: list) -> None:
    """Wraps every entry point so that a call is recorded (and still made)."""
    import importlib

    for module_name, attribute in TORCH_CUDA_ENTRY_POINTS:
        module = importlib.import_module(module_name)
        original = getattr(module, attribute, None)
        if original is None:
            continue

        def wrapper(*args, _original=original, _name=f"{module_name}.{attribute}", **kwargs):
            calls.append(_name)
            return _original(*args, **kwargs)

        setattr(module, attribute, wrapper)


def _exercise_host_paths(connection) -> None:
    """Runs in the forked worker: every host path, then reports what touched CUDA."""
    try:
        # A forked child must not enter an OpenMP parallel region when the parent
        # already ran one (libgomp's team does not survive fork: the child hangs);
        # earlier tests of the same pytest process run parallel torch ops.
        torch.set_num_threads(1)
        from tensorxfer.inference import unified_memory as um
        from tensorxfer.ipc.replay_pipelines.base import ReplayTickMetadata
        from tensorxfer.ipc.replay_pipelines.transfer import build_replay_transfer_backend

        torch_calls: list = []
        _record_torch_cuda_calls(torch_calls)
        native_before = _core.cuda_runtime_calls()

        um.prefetch_managed_tensor(np.zeros(1 << 20, np.uint8), device=-1)
        um.prefetch_managed_tensor(torch.zeros(1 << 16), device=-1)
        um.advise_managed_tensor_preferred_location(np.zeros(1 << 16, np.uint8), device=-1)
        module = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.BatchNorm1d(64))
        prefetched = um.prefetch_managed_module_parameters(module, device=-1, include_buffers=True)
        um.advise_managed_module_parameters_preferred_location(module, device=-1)

        copied = []
        with build_replay_transfer_backend(device="cpu", ring_depth=2) as backend:
            host_slots = [np.full(1 << 16, index + 1, np.uint8) for index in range(2)]
            backend.register_host_slots(host_slots)
            device_slots = backend.allocate_device_slots(count=2, shape=(1 << 16,), dtype=torch.uint8)
            for tick_id, slot in enumerate((1, 0)):
                metadata = ReplayTickMetadata(tick_id=tick_id, snapshot_ptr=0, snapshot_size=0, sample_seed=0,
                                              sample_count=1, batch_host_slot=slot, batch_gpu_slot=slot)
                backend.submit_h2d(slot=slot, dst=device_slots[slot], src=torch.from_numpy(host_slots[slot]),
                                   metadata=metadata)
                backend.synchronize_ready(slot)
                backend.wait_current_stream_for_ready(slot)
                copied.append(bool((device_slots[slot] == slot + 1).all()))

        connection.send({
            "native_cuda_calls": _core.cuda_runtime_calls() - native_before,
            "torch_cuda_calls": torch_calls,
            "cuda_initialized": torch.cuda.is_initialized(),
            "prefetched": prefetched,
            "copied": copied,
        })
    except BaseException as error:  # reported to the parent, which fails the test with it
        connection.send({"error": repr(error)})
    finally:
        connection.close()


@pytest.mark.multiprocess
def test_host_paths_in_a_forked_worker_make_no_cuda_call():
    context = multiprocessing.get_context("fork")
    receiver, sender = context.Pipe(duplex=False)
    worker = context.Process(target=_exercise_host_paths, args=(sender,))
    worker.start()
    sender.close()
    try:
        assert receiver.poll(60), "the forked worker reported nothing within 60 s"
        report = receiver.recv()
    finally:
        worker.join(timeout=30)
        if worker.is_alive():
            worker.kill()
            worker.join()
    assert "error" not in report, report.get("error")
    assert worker.exitcode == 0
    assert report["copied"] == [True, True] and report["prefetched"] > 0
    assert report["torch_cuda_calls"] == [], "a host path asked torch for CUDA"
    assert report["native_cuda_calls"] == 0, "a host path made a CUDA runtime call in the core"
    assert report["cuda_initialized"] is False


def test_the_counter_counts_the_cores_cuda_calls():
    before = _core.cuda_runtime_calls()
    status = _core.cuda_status()
    if status["compiled"]:
        assert _core.cuda_runtime_calls() > before
    else:
        assert _core.cuda_runtime_calls() == before == 0
