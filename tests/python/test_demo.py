"""The replay demo: runs end to end, verifies every batch, fails clearly, cleans up."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from tensorxfer.demo import store as replay_store

REPO = Path(__file__).resolve().parents[2]
SMALL = ["--collectors", "2", "--batch-rows", "64", "--store-rows", "4096", "--obs-dim", "16",
         "--ring-depth", "2"]


def run_cli(*args: str, timeout: float = 90.0) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tensorxfer", "demo", *args], capture_output=True,
                          text=True, timeout=timeout, env=os.environ.copy())


def small_options(**overrides):
    from tensorxfer.demo.replay_demo import DemoOptions

    values = dict(seconds=3.0, collectors=2, batch_rows=64, store_rows=4096, obs_dim=16, ring_depth=2)
    values.update(overrides)
    return DemoOptions(**values)


@pytest.mark.multiprocess
@pytest.mark.fast
def test_demo_cli_runs_and_verifies_every_batch():
    result = run_cli("--seconds", "3", "--json", *SMALL)
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["verified"] > 0
    assert summary["verified"] == summary["batches"]
    assert summary["batches_per_s"] > 0 and summary["gb_per_s"] > 0
    assert 0 < summary["handoff_latency_us"]["p50"] <= summary["handoff_latency_us"]["p99"]
    waiting = summary["handoff_latency_waiting_us"]
    assert 0 <= waiting["batches"] <= summary["batches"]
    assert (waiting["p50"] is None) == (waiting["batches"] == 0)
    assert 0.0 <= summary["hidden_share"] <= 1.0
    assert summary["backend"] == "HostReplayTransferBackend"
    layout = replay_store.batch_layout(16, 64)
    assert summary["batch_bytes"] == layout.nbytes


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_demo_with_remote_collectors_verifies_every_batch_and_counts_them_apart():
    """One local and two remote collectors (simulated hosts when root): every batch verified,
    local and remote batches/s reported apart, nothing left in /dev/shm (the autouse check)."""
    pytest.importorskip("torch", reason="remote collectors need torch (pip install .[torch])")
    result = run_cli("--batches", "150", "--seconds", "60", "--json", "--collectors", "1",
                     "--remote-collectors", "2", "--ring-depth", "6", "--batch-rows", "64", "--store-rows", "4096",
                     "--obs-dim", "16", timeout=150)
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["verified"] == summary["batches"] == 150
    assert summary["local_batches"] > 0 and summary["remote_batches"] > 0
    assert summary["local_batches"] + summary["remote_batches"] == 150
    assert summary["local_batches_per_s"] > 0 and summary["remote_batches_per_s"] > 0
    assert summary["remote_collectors"] == 2
    assert summary["remote_handoff_latency_us"]["p50"] > 0
    text = subprocess.run([sys.executable, "-c", "import json, sys; from tensorxfer.demo.replay_demo import "
                           "format_summary; print(format_summary(json.load(sys.stdin)))"],
                          input=result.stdout, capture_output=True, text=True, timeout=60)
    assert "remote" in text.stdout and "batches/s" in text.stdout, text.stderr


@pytest.mark.multiprocess
def test_run_demo_stops_after_batch_limit_and_text_summary():
    from tensorxfer.demo.replay_demo import format_summary, run_demo

    summary = run_demo(small_options(seconds=60.0, batches=25))
    assert summary["batches"] == 25 and summary["verified"] == 25
    text = format_summary(summary)
    assert "25 of 25 batches verified" in text
    assert "handoff     p50" in text and "hidden behind compute" in text


@pytest.mark.multiprocess
def test_run_demo_with_torch_slots_through_the_torch_copy_backend():
    torch = pytest.importorskip("torch")
    from tensorxfer.demo.replay_demo import run_demo
    from tensorxfer.ipc.replay_pipelines.transfer import TorchCopyReplayTransferBackend

    built = []

    def factory(*, device, ring_depth):
        built.append(TorchCopyReplayTransferBackend(device=device, ring_depth=ring_depth))
        return built[-1]

    summary = run_demo(small_options(seconds=60.0, batches=15), backend_factory=factory)
    assert summary["backend"] == "TorchCopyReplayTransferBackend"
    assert summary["batches"] == 15 and summary["verified"] == 15
    assert built and built[0].device == torch.device("cpu")


@pytest.mark.multiprocess
def test_collector_death_makes_learner_fail_with_peer_lost():
    from tensorxfer import PeerLost
    from tensorxfer.demo.replay_demo import run_demo

    killed: list[int] = []

    def kill_first_collector(pids: list[int]) -> None:
        def kill() -> None:
            killed.append(pids[0])
            os.kill(pids[0], signal.SIGKILL)

        threading.Timer(0.3, kill).start()

    begin = time.monotonic()
    with pytest.raises(PeerLost, match=r"collector 0 \(pid \d+\) exited with code -9"):
        run_demo(small_options(seconds=30.0), on_started=kill_first_collector)
    assert killed, "the collector was never killed"
    assert time.monotonic() - begin < 25.0


@pytest.mark.multiprocess
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_cleans_up_and_exits_130(signum):
    before = {n for n in os.listdir("/dev/shm") if n.startswith("tensorxfer-")}
    process = subprocess.Popen([sys.executable, "-m", "tensorxfer", "demo", "--seconds", "60", *SMALL],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=os.environ.copy())
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # wait for the store and the ring to exist
            now = {n for n in os.listdir("/dev/shm") if n.startswith("tensorxfer-")} - before
            if len(now) >= 2:
                break
            time.sleep(0.05)
        time.sleep(2.0)  # collectors started (or still starting: both paths must clean up)
        process.send_signal(signum)
        _, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 130, err
    assert "interrupted" in err
    left = {n for n in os.listdir("/dev/shm") if n.startswith("tensorxfer-")} - before
    assert not left, f"demo pid {process.pid} left {sorted(left)}; stderr: {err}"


def test_bad_options_exit_2_naming_the_option():
    result = run_cli("--collectors", "1")
    assert result.returncode == 2
    assert "--collectors must be >= 2, got 1" in result.stderr
    result = run_cli("--ring-depth", "1")
    assert result.returncode == 2 and "--ring-depth must be >= 2, got 1" in result.stderr
    result = run_cli("--device", "not-a-device", "--seconds", "1", *SMALL)
    assert result.returncode == 2 and "--device 'not-a-device'" in result.stderr


def test_missing_device_fails_clearly():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the missing-device path cannot be shown here")
    result = run_cli("--device", "cuda", "--seconds", "1", *SMALL)
    assert result.returncode == 3, result.stderr
    assert "cuda" in result.stderr.lower() and "FAILED" in result.stderr


def test_example_script_runs_the_same_code():
    script = REPO / "examples" / "replay_pipeline.py"
    if not script.exists():
        pytest.skip("examples/ is not part of an installed package")
    result = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True,
                            timeout=60, env=os.environ.copy())
    assert result.returncode == 0, result.stderr
    for option in ("--seconds", "--batches", "--collectors", "--batch-rows", "--device",
                   "--ring-depth", "--seed", "--json"):
        assert option in result.stdout


def test_batch_indices_are_deterministic_per_seed_and_tick():
    first = replay_store.batch_indices(7, 3, 256, 1000)
    assert first.dtype == np.int64 and first.shape == (256,)
    assert np.array_equal(first, replay_store.batch_indices(7, 3, 256, 1000))
    assert not np.array_equal(first, replay_store.batch_indices(7, 4, 256, 1000))
    assert not np.array_equal(first, replay_store.batch_indices(8, 3, 256, 1000))
    assert first.min() >= 0 and first.max() < 1000
    ticks = {replay_store.collector_tick(c, 3, s) for c in range(3) for s in range(50)}
    assert len(ticks) == 150  # collectors never produce the same tick


def _store_arrays(rows: int = 100) -> dict:
    generator = np.random.default_rng(1)
    return {"obs": generator.standard_normal((rows, 4), dtype=np.float32),
            "reward": generator.standard_normal(rows, dtype=np.float32)}


def test_verify_batch_accepts_the_right_rows_and_names_a_wrong_one():
    arrays = _store_arrays()
    indices = np.array([5, 17, 5, 99], dtype=np.int64)
    fields = {name: array[indices].copy() for name, array in arrays.items()}
    replay_store.verify_batch(fields, arrays, indices, tick=11)
    fields["obs"][2, 3] += 1.0
    with pytest.raises(replay_store.BatchMismatch, match=r"tick 11: field 'obs' .* 1 of 4 rows; "
                                                         r"first at batch row 2 \(store row 5\)"):
        replay_store.verify_batch(fields, arrays, indices, tick=11)


def test_verify_batch_refuses_missing_field_and_wrong_shape():
    arrays = _store_arrays()
    indices = np.arange(3, dtype=np.int64)
    with pytest.raises(replay_store.BatchMismatch, match="field 'reward' is missing"):
        replay_store.verify_batch({"obs": arrays["obs"][indices]}, arrays, indices, tick=0)
    fields = {"obs": arrays["obs"][indices].astype(np.float64), "reward": arrays["reward"][indices]}
    with pytest.raises(replay_store.BatchMismatch, match=r"field 'obs' has float64\[3, 4\], expected float32"):
        replay_store.verify_batch(fields, arrays, indices, tick=0)


def test_options_validation_names_the_option():
    with pytest.raises(ValueError, match="--seconds must be > 0, got 0"):
        small_options(seconds=0).validate()
    with pytest.raises(ValueError, match="--batches must be >= 1, got 0"):
        small_options(batches=0).validate()


@pytest.mark.parametrize("error, code, text", [
    (replay_store.BatchMismatch("batch of tick 3: field 'obs' differs"), 1, "batch verification: batch of tick 3"),
    (TimeoutError("no batch from any collector for 10 s"), 3, "TimeoutError: no batch from any collector"),
])
def test_main_maps_failures_to_exit_codes(monkeypatch, capsys, error, code, text):
    from tensorxfer.demo import replay_demo

    def failing_run(options, **kwargs):
        raise error

    monkeypatch.setattr(replay_demo, "run_demo", failing_run)
    assert replay_demo.main(["--seconds", "1"]) == code
    err = capsys.readouterr().err
    assert "replay demo FAILED" in err and text in err
