"""The "tensorxfer" torch.distributed backend, with real processes, against gloo's results."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import torch_or_skip

torch = torch_or_skip()

import torch_backend_workers as workers  # noqa: E402

pytestmark = pytest.mark.multiprocess

#: gloo reduces a non-contiguous tensor's first elements of storage, not its
#: elements (checked against the true sum below instead).
NOT_COMPARED_WITH_GLOO = {"all_reduce/non_contiguous"}
#: gloo runs async ops on several threads, so a chain of them that depend on each
#: other has no one reference result there: checked against the expected values.
IN_ORDER_KEYS = ("async_in_order/a", "async_in_order/b", "async_in_order/parts")


def _out(tmp_path, name):
    path = tmp_path / name
    path.mkdir()
    return str(path)


def _assert_same(expected, got, what):
    assert expected.keys() == got.keys(), what
    for key in expected:
        a, b = expected[key], got[key]
        assert a.dtype == b.dtype and a.shape == b.shape, (what, key, a.dtype, b.dtype, a.shape, b.shape)
        assert torch.equal(a, b), (what, key, a, b)


def _ops_match_gloo(world, tmp_path):
    reference = workers.launch("ops", world, "gloo", _out(tmp_path, "gloo"), timeout_s=110)
    results = workers.launch("ops", world, "tensorxfer", _out(tmp_path, "tx"), timeout_s=110)
    for rank in range(world):
        for key in NOT_COMPARED_WITH_GLOO:
            reference[rank].pop(key)
            got = results[rank].pop(key)
            whole = sum(workers._ints((64, 8), r, torch.float32) for r in range(world))
            assert torch.equal(got, whole[:, ::2]), got
        root_values = workers._ints(300, world - 1, torch.float32)
        expected = {"async_in_order/a": sum(workers._ints(5000, r, torch.float32) for r in range(world)),
                    "async_in_order/b": root_values * world,
                    "async_in_order/parts": torch.stack([root_values] * world)}
        for key in IN_ORDER_KEYS:
            reference[rank].pop(key)
            assert torch.equal(results[rank].pop(key), expected[key]), key
        assert len(results[rank]) > 100
        _assert_same(reference[rank], results[rank], f"rank {rank}")


def test_import_registers_lazily_without_importing_torch():
    code = ("import sys, tensorxfer, tensorxfer.distributed as d\n"
            "assert 'torch' not in sys.modules, 'import tensorxfer imported torch'\n"
            "assert not d.is_registered()\n"
            "import torch.distributed as dist\n"
            "assert d.is_registered() and 'tensorxfer' in dist.Backend.backend_list\n"
            "print('ok')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_import_after_torch_registers_at_once():
    code = ("import torch.distributed as dist, tensorxfer, tensorxfer.distributed as d\n"
            "assert d.is_registered() and dist.Backend.TENSORXFER == 'tensorxfer'\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_mixed_backend_string_and_other_devices(tmp_path):
    code = f"""
import torch, torch.distributed as dist, tensorxfer
dist.init_process_group("cpu:tensorxfer,cuda:nccl", init_method="file://{tmp_path}/store", rank=0, world_size=1)
assert type(dist.group.WORLD).__name__ == "TensorxferProcessGroup", type(dist.group.WORLD)
t = torch.arange(4.0)
dist.all_reduce(t)
assert t.tolist() == [0.0, 1.0, 2.0, 3.0]
from torch.distributed import distributed_c10d as c10d
assert dist.group.WORLD._device_types == [torch.device("cpu"), torch.device("cuda")], dist.group.WORLD._device_types
assert c10d._get_object_coll_device() == "cpu"
try:
    dist.all_reduce(torch.ones(2, device="meta"))
except RuntimeError as error:
    assert "no backend was named for meta" in str(error), error
else:
    raise AssertionError("a meta tensor was accepted")
dist.destroy_process_group()
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr


def test_waits_sleep_during_async_ops_and_spin_again_once_the_queue_is_empty(tmp_path):
    # Synchronous ops run on the caller's thread without setting the waits: they rely on
    # the op thread putting the spinning waits back when its queue empties.
    code = f"""
import time, torch, torch.distributed as dist, tensorxfer
dist.init_process_group("tensorxfer", init_method="file://{tmp_path}/store", rank=0, world_size=1)
pg = dist.group.WORLD
spinning = pg._comm.spin_us
assert spinning > 0, spinning
seen = []
pg._host.all_reduce, real = (lambda t, op: (seen.append(pg._comm.spin_us), real(t, op))), pg._host.all_reduce
works = [dist.all_reduce(torch.ones(100), async_op=True) for _ in range(3)]
for work in works:
    work.wait()
deadline = time.monotonic() + 10
while pg._comm.spin_us != spinning and time.monotonic() < deadline:
    time.sleep(0.001)
assert pg._comm.spin_us == spinning, pg._comm.spin_us
dist.all_reduce(torch.ones(100))
assert seen == [0.0, 0.0, 0.0, spinning], seen
dist.destroy_process_group()
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr


@pytest.mark.parametrize("world", [1, 2])
def test_every_op_matches_gloo(world, tmp_path):
    _ops_match_gloo(world, tmp_path)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("world", [3, pytest.param(4, marks=pytest.mark.stress)])
def test_every_op_matches_gloo_more_ranks(world, tmp_path):
    _ops_match_gloo(world, tmp_path)


def test_ranks_may_disagree_on_async_op(tmp_path):
    # torch lets each rank choose async_op; gloo meets either way, and so must we (a
    # communicator per waiting style made the ranks wait on different ones until the timeout).
    world = 2
    results = workers.launch("mixed_async", world, "tensorxfer", _out(tmp_path, "tx"), timeout_s=60,
                             pg_timeout_s=20.0)
    for rank in range(world):
        for step, numel in enumerate((1000, 300_000, 1000)):
            expected = sum(workers._ints(numel, r, torch.float32, salt=step) for r in range(world))
            assert torch.equal(results[rank][f"all_reduce/{step}"], expected), (rank, step)
        expected = torch.cat([workers._ints(10, r, torch.float32) for r in range(world)])
        assert torch.equal(results[rank]["all_gather_into_tensor"], expected), rank


def test_avg_is_sum_over_world_size(tmp_path):
    sums = workers.launch("avg", 2, "gloo", _out(tmp_path, "gloo"), extra="sum")
    avgs = workers.launch("avg", 2, "tensorxfer", _out(tmp_path, "tx"), extra="avg")
    for rank in range(2):
        for key, total in sums[rank].items():
            torch.testing.assert_close(avgs[rank][key], total / 2)


@pytest.mark.parametrize("world", [2, 3])
def test_results_bitwise_identical_on_every_rank(world, tmp_path):
    results = workers.launch("random_sum", world, "tensorxfer", _out(tmp_path, "tx"))
    for rank in range(1, world):
        _assert_same(results[0], results[rank], f"rank {rank} vs rank 0")
    if world == 2:  # two addends: every order gives gloo's sum
        _assert_same(workers.launch("random_sum", 2, "gloo", _out(tmp_path, "gloo"))[0], results[0], "gloo")


@pytest.mark.fast
def test_ddp_20_steps_bitwise_equal_to_gloo(tmp_path):
    reference = workers.launch("ddp", 2, "gloo", _out(tmp_path, "gloo"))
    results = workers.launch("ddp", 2, "tensorxfer", _out(tmp_path, "tx"))
    _assert_same(reference[0], results[0], "rank 0")
    _assert_same(results[0], results[1], "rank 1 vs rank 0")
    first_layer = results[0]["0.weight"]
    torch.manual_seed(0)
    assert not torch.equal(first_layer, torch.nn.Linear(32, 64).weight.detach()), "DDP did not train"


def test_barrier_and_object_collectives_run_on_this_backend_on_the_cpu(tmp_path):
    """torch picks the device of barrier() and of the object collectives from the group's device
    types; a Python group has none registered, so _get_pg_default_device raised before the group
    reported its own. Every op must reach this backend's shared-memory collectives (no gloo)."""
    results = workers.launch("barrier_and_objects", 2, "tensorxfer", _out(tmp_path, "tx"))
    expected_gathered = [{"rank": r, "payload": list(range(r + 3))} for r in range(2)]
    for result in results:
        assert result["device_capability"] == ["cpu"] and result["object_device"] == "cpu", result
        assert result["default_device"] == "cpu", result["default_device"]
        assert result["gathered"] == expected_gathered, result["gathered"]
        assert result["objects"] == [{"from": "root", "size": 7}, "text"], result["objects"]
        assert result["delegated"] == 0, result
        calls = result["calls"]
        assert calls[:2] == ["barrier:cpu", "barrier:host"], calls
        handed = [call for call in calls if not call.endswith(":host")]
        assert {call.split(":", 1)[1] for call in handed} == {"cpu"}, calls
        assert calls.count("all_gather:host") >= 2 and calls.count("broadcast:host") >= 2, calls


def test_futures_complete_after_the_data_also_under_ddp_comm_hooks(tmp_path):
    """A then() callback sees the reduced data; DDP comm hooks whose callbacks start a second
    all_reduce and wait for it (PowerSGD's pattern, and PowerSGD) train as over gloo. Before
    futures were completed off the op thread, such a callback waited there for an op only that
    thread could run: the ranks hung until the launch timed out."""
    reference = workers.launch("future_hooks", 2, "gloo", _out(tmp_path, "gloo"), timeout_s=120)
    results = workers.launch("future_hooks", 2, "tensorxfer", _out(tmp_path, "tx"), timeout_s=120,
                             pg_timeout_s=60)
    expected = sum(workers._ints(300_000, r, torch.float32) for r in range(2))
    for rank in range(2):
        assert torch.equal(results[rank].pop("seen_in_then"), expected), rank
        reference[rank].pop("seen_in_then")
        _assert_same(reference[rank], results[rank], f"rank {rank}")
    _assert_same(results[0], results[1], "rank 1 vs rank 0")


def test_works_the_caller_drops_still_complete(tmp_path):
    results = workers.launch("dropped_works", 2, "tensorxfer", _out(tmp_path, "tx"))
    for rank, result in enumerate(results):
        for i in range(4):
            expected = sum(workers._ints(50_000, r, torch.float32, salt=i) for r in range(2))
            assert torch.equal(result[f"all_reduce/{i}"], expected), (rank, i)
        assert torch.equal(result["irecv"], workers._ints(10, 1 - rank, torch.float32)), rank


def test_fsdp_on_cpu_matches_gloo(tmp_path):
    fsdp = pytest.importorskip("torch.distributed.fsdp", reason="this torch has no FSDP")
    if not hasattr(fsdp, "fully_shard"):
        pytest.skip(f"torch {torch.__version__} has no fully_shard (FSDP2), which runs on the CPU")
    reference = workers.launch("fsdp", 2, "gloo", _out(tmp_path, "gloo"))
    results = workers.launch("fsdp", 2, "tensorxfer", _out(tmp_path, "tx"))
    _assert_same(reference[0], results[0], "rank 0")
    _assert_same(results[0], results[1], "rank 1 vs rank 0")


def _kill_victim_and_collect(tmp_path, extra, world=3, victim=1, pg_timeout=20.0):
    out = _out(tmp_path, "tx")
    processes = workers.start("victim", world, "tensorxfer", out, pg_timeout_s=pg_timeout, extra=extra)
    outputs, elapsed = workers.kill_and_finish(processes, victim, timeout_s=pg_timeout + 30)
    for rank, (code, text) in enumerate(outputs):
        if rank != victim:
            assert code == 0, text
    results = [torch.load(os.path.join(out, f"{rank}.pt")) for rank in range(world) if rank != victim]
    return results, elapsed


@pytest.mark.parametrize("op", ["all_reduce", "delegated"])
def test_killed_rank_is_named_by_every_survivor_within_the_timeout(op, tmp_path):
    pg_timeout = 20.0
    results, elapsed = _kill_victim_and_collect(tmp_path, f"1,{op}", pg_timeout=pg_timeout)
    for result in results:
        assert result["error"] is not None, result
        assert "rank 1" in result["error"], result
        assert result["seconds"] < pg_timeout, result
    assert elapsed < pg_timeout + 15
    # the conftest fixture checks that /dev/shm holds nothing of ours afterwards


def test_mismatched_sizes_raise_on_every_rank_in_the_users_words(tmp_path):
    results = workers.launch("mismatch", 2, "tensorxfer", _out(tmp_path, "tx"), pg_timeout_s=20)
    called = {0: "all_reduce(SUM, float32, 1000 elements)", 1: "all_reduce(SUM, float32, 2000 elements)"}
    for rank, result in enumerate(results):
        error = result["error"]
        assert error is not None and "different operations" in error, result
        assert f"rank {rank} called {called[rank]}, rank {1 - rank} called {called[1 - rank]}" in error, result


def test_ctrl_c_interrupts_a_blocked_op(tmp_path):
    out = _out(tmp_path, "tx")
    processes = workers.start("interrupt", 2, "tensorxfer", out, pg_timeout_s=60, extra=out)
    line = processes[0].stdout.readline()
    assert "BLOCKING" in line, line
    time.sleep(0.5)
    processes[0].send_signal(signal.SIGINT)
    outputs = workers.finish(processes, timeout_s=60)
    assert outputs[0][0] == 0, outputs[0][1]
    interrupted_after = torch.load(os.path.join(out, "0.pt"))["interrupted_after"]
    assert interrupted_after is not None and interrupted_after < 5.0, interrupted_after


def test_exit_without_destroy_leaves_dev_shm_clean(tmp_path):
    results = workers.launch("no_destroy", 2, "tensorxfer", _out(tmp_path, "tx"))
    assert [r["sum"].tolist() for r in results] == [[2.0] * 4] * 2
    # the conftest fixture fails the test if a segment is left in /dev/shm


def test_info_says_the_backend_is_registered():
    done = subprocess.run([sys.executable, "-m", "tensorxfer", "info", "--json"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    import json

    backend = json.loads(done.stdout)["torch_distributed_backend"]
    assert backend["name"] == "tensorxfer" and backend["registered"] is True, backend


def test_import_torch_alone_registers_through_the_entry_point(tmp_path):
    """pyproject.toml declares a torch.backends entry point; torch loads that group while it is imported.

    The child sees the entry point through a dist-info directory on its path (the checkout is not
    installed in the test), written from pyproject.toml's own declaration."""
    import tomllib

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    with open(os.path.join(root, "pyproject.toml"), "rb") as file:
        declared = tomllib.load(file)["project"]["entry-points"]["torch.backends"]
    assert declared == {"tensorxfer": "tensorxfer.distributed:register_from_torch_import"}, declared
    info = tmp_path / "tensorxfer_entry_point_probe-0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tensorxfer-entry-point-probe\nVersion: 0\n")
    (info / "entry_points.txt").write_text(
        "[torch.backends]\n" + "".join(f"{name} = {target}\n" for name, target in declared.items()))
    code = f"""
import sys
sys.path.insert(0, {str(tmp_path)!r})
import torch
assert "tensorxfer" in sys.modules, "import torch did not load the entry point"
import tensorxfer.distributed as d, torch.distributed as dist
assert d.is_registered() and "tensorxfer" in dist.Backend.backend_list
dist.init_process_group("tensorxfer", init_method="file://{tmp_path}/store", rank=0, world_size=1)
t = torch.arange(3.0)
dist.all_reduce(t)
dist.destroy_process_group()
print("ok", t.tolist())
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="1"))
    assert done.returncode == 0 and "ok [0.0, 1.0, 2.0]" in done.stdout, done.stdout + done.stderr
