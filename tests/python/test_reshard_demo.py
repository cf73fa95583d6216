"""The resharding demo: its plan covers every byte once, every backend verifies, failures exit clearly."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from typing import List

import numpy as np
import pytest

from tensorxfer.demo import reshard_model as model_lib
from tensorxfer.demo.reshard_demo import backend_availability

SMALL = ["--ranks", "3", "--target-parts", "2", "--total-mib", "1", "--repeat", "2"]


def run_cli(*args: str, timeout: float = 120.0) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tensorxfer", "reshard-demo", *args], capture_output=True,
                          text=True, timeout=timeout, env=os.environ.copy())


def need(backend: str) -> None:
    reason = backend_availability()[backend]
    if reason is not None:
        pytest.skip(f"{backend} backend unavailable here: {reason}")


# ---- the model and the plan (in process) ---------------------------------------------------


def test_model_has_a_few_hundred_mixed_tensors_of_about_the_requested_size():
    model = model_lib.build_model(64)
    total = sum(spec.nbytes for spec in model)
    assert 100 <= len(model) <= 400
    assert 0.8 * (64 << 20) <= total <= 64 << 20
    assert {spec.dtype for spec in model} >= {"float16", "float32", "float64", "int8", "int32"}
    assert {len(spec.shape) for spec in model} == {1, 2}


@pytest.mark.parametrize("ranks,target_parts", [(4, 2), (3, 2), (2, 2), (1, 1), (5, 3)])
def test_tasks_cover_every_element_of_every_target_shard_exactly_once(ranks, target_parts):
    model = model_lib.build_model(0.05)
    tasks = model_lib.plan_tasks(model, ranks, target_parts)
    assert [t.task_id for t in tasks] == list(range(len(tasks)))
    assert sum(t.nbytes for t in tasks) == sum(spec.nbytes for spec in model)
    for index, spec in enumerate(model):
        for part in range(target_parts):
            region = model_lib.shard_region(spec, spec.target_dim, target_parts, part)
            hits = np.zeros(model_lib.region_shape(region), np.int32)
            for task in tasks:
                if task.tensor == index and task.dst_rank == part:
                    hits[task.dst_slices] += 1
            assert (hits == 1).all(), (spec.name, part)


def test_moving_the_planned_slices_by_hand_rebuilds_the_independently_recomputed_target():
    model = model_lib.build_model(0.2)
    ranks, target_parts, seed = 4, 2, 7
    tasks = model_lib.plan_tasks(model, ranks, target_parts)
    sources = {(t, p): model_lib.generate_region(spec, t, seed, model_lib.shard_region(spec, spec.source_dim,
                                                                                       ranks, p))
               for t, spec in enumerate(model) for p in range(ranks)}
    for part in range(target_parts):
        expected = model_lib.expected_target_shards(model, seed, target_parts, part)
        rebuilt = {t: np.zeros_like(shard) for t, shard in expected.items()}
        for task in tasks:
            if task.dst_rank == part:
                rebuilt[task.tensor][task.dst_slices] = sources[(task.tensor, task.src_rank)][task.src_slices]
        for t, spec in enumerate(model):
            assert model_lib.first_mismatch(spec, part, target_parts, rebuilt[t], expected[t]) is None


def test_ranks_without_a_target_part_only_send_and_destinations_mix_contiguous_and_strided():
    model = model_lib.build_model(0.2)
    tasks = model_lib.plan_tasks(model, 4, 2)
    assert {t.dst_rank for t in tasks} == {0, 1}
    assert {t.src_rank for t in tasks} == {0, 1, 2, 3}
    contiguity = set()
    for task in tasks:
        spec = model[task.tensor]
        shard = np.empty(model_lib.region_shape(model_lib.shard_region(spec, spec.target_dim, 2, task.dst_rank)),
                         spec.dtype)
        contiguity.add(shard[task.dst_slices].flags.c_contiguous)
    assert contiguity == {True, False}  # the embedding tables' destinations are strided


def test_values_differ_between_seeds_and_tensors_and_a_changed_byte_is_named():
    model = model_lib.build_model(0.05)
    spec = model[1]
    a = model_lib.generate_full(spec, 1, seed=0)
    assert not np.array_equal(a.view(np.uint8), model_lib.generate_full(spec, 1, seed=1).view(np.uint8))
    assert not np.array_equal(a.view(np.uint8), model_lib.generate_full(spec, 2, seed=0).view(np.uint8))
    shard = model_lib.expected_target_shards(model, 0, 2, 1)[1]
    corrupted = shard.copy()
    corrupted.reshape(-1).view(np.uint8)[5] ^= 1
    message = model_lib.first_mismatch(spec, 1, 2, corrupted, shard)
    assert message is not None and repr(spec.name) in message and "1 of" in message


# ---- the command line (real processes) ------------------------------------------------------


def test_cli_help_lists_the_options_and_the_top_level_help_lists_the_command():
    result = run_cli("--help", timeout=60)
    assert result.returncode == 0, result.stderr
    for option in ("--backends", "--ranks", "--target-parts", "--total-mib", "--repeat", "--seed", "--json",
                   "--timeout"):
        assert option in result.stdout
    assert "--test-kill-rank" not in result.stdout
    top = subprocess.run([sys.executable, "-m", "tensorxfer", "--help"], capture_output=True, text=True,
                         timeout=60, env=os.environ.copy())
    assert "reshard-demo" in top.stdout


@pytest.mark.parametrize("args,flag", [(["--ranks", "2", "--target-parts", "3"], "--target-parts"),
                                       (["--backends", "carrier-pigeon"], "--backends"),
                                       (["--total-mib", "0"], "--total-mib")])
def test_bad_options_exit_2_naming_the_option(args, flag):
    result = run_cli(*args, timeout=60)
    assert result.returncode == 2
    assert flag in result.stderr


@pytest.mark.multiprocess
@pytest.mark.parametrize("backend", ["local", "torch", "mpi", pytest.param("shm", marks=pytest.mark.fast)])
def test_each_available_backend_moves_and_verifies_every_byte(backend):
    need(backend)
    result = run_cli("--backends", backend, *SMALL, "--json", "--seed", "3")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    (only,) = summary["backends"]
    model = model_lib.build_model(1)
    total = sum(spec.nbytes for spec in model)
    assert only["backend"] == backend
    assert only["total_bytes"] == total
    assert only["tasks"] == len(model_lib.plan_tasks(model, 3, 2))
    assert only["verified_bytes"] == 2 * total  # both runs, every target byte
    assert [run["run"] for run in only["runs"]] == [1, 2]
    assert all(run["gb_per_s"] > 0 for run in only["runs"])
    assert only["processes"] == (1 if backend == "local" else 3)
    if backend in ("mpi", "torch"):  # the batched services count plan builds
        assert only["plans_built"] == 1  # the second run reused the first run's plan
    assert summary["cpu_model"]
    # each backend's GB/s beside the floor (one process copying the same bytes as one block)
    assert summary["floor_gb_per_s"] > 0
    assert only["repeat_vs_floor"] == pytest.approx(only["repeat_gb_per_s"] / summary["floor_gb_per_s"])
    # without --json the progress lines and the table go to stdout
    if backend == "local":
        text = run_cli("--backends", backend, *SMALL)
        assert text.returncode == 0, text.stderr
        assert "local: run 2/2 verified" in text.stdout and "repeat GB/s" in text.stdout
        assert "vs floor" in text.stdout and "one process copying the same bytes" in text.stdout


def _first_received_tensor(rank: int, ranks: int = 3, target_parts: int = 2) -> str:
    model = model_lib.build_model(1)
    task = next(t for t in model_lib.plan_tasks(model, ranks, target_parts) if t.dst_rank == rank)
    return model[task.tensor].name


@pytest.mark.multiprocess
@pytest.mark.parametrize("backend", ["local", "torch", "shm"])
def test_a_corrupted_receive_exits_1_naming_the_tensor(backend):
    need(backend)
    result = run_cli("--backends", backend, *SMALL, "--test-corrupt-rank", "1")
    assert result.returncode == 1, result.stderr
    name = _first_received_tensor(1)
    assert f"tensor {name!r}" in result.stderr
    assert "run 1, rank 1" in result.stderr and "run 2" not in result.stderr  # run 2 received correctly


@pytest.mark.multiprocess
@pytest.mark.parametrize("backend", ["torch", "mpi", "shm"])
def test_a_killed_rank_exits_3_within_the_timeout(backend):
    need(backend)
    begin = time.monotonic()
    result = run_cli("--backends", backend, *SMALL, "--timeout", "15", "--test-kill-rank", "1")
    elapsed = time.monotonic() - begin
    assert result.returncode == 3, result.stderr
    assert re.search(r"lost rank 1\b", result.stderr), result.stderr
    assert elapsed < 15 + 40, elapsed  # the timeout, plus process start-up on a busy machine


def _worker_pids(marker: str) -> List[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as file:
                command = file.read().split(b"\0")
        except OSError:
            continue
        if b"tensorxfer.demo.reshard_worker" in command and marker.encode() in command:
            pids.append(int(entry))
    return pids


@pytest.mark.multiprocess
def test_ctrl_c_stops_every_rank_and_exits_130():
    need("torch")
    seed = str(900_000 + os.getpid() % 10_000)  # marks this test's workers
    process = subprocess.Popen([sys.executable, "-m", "tensorxfer", "reshard-demo", "--backends", "torch",
                                "--ranks", "2", "--total-mib", "1", "--repeat", "1000", "--seed", seed],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=os.environ.copy())
    try:
        assert process.stdout is not None
        for line in process.stdout:  # plain progress lines (stdout is not a terminal)
            if "run 1/1000 verified" in line:
                break
        assert _worker_pids(seed), "no worker was running"
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 130, err
    assert "interrupted" in err
    deadline = time.monotonic() + 10
    while _worker_pids(seed) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _worker_pids(seed)
