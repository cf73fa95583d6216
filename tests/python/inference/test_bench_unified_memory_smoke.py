"""The unified-memory benchmark runs end to end at a small size and writes its JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "bench" / "python" / "bench_unified_memory.py"


@pytest.mark.stress
def test_small_run_prints_ratios_and_writes_json(tmp_path):
    out = tmp_path / "nested" / "um.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--size", "4M", "--repeats", "1", "--json", str(out)],
        capture_output=True, text=True, timeout=100, env=env, check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "ratios" in result.stdout and "pool+prefetch" in result.stdout
    report = json.loads(out.read_text())
    assert report["config"]["size_bytes"] == 4 << 20
    variants = {m["variant"] for m in report["measurements"]}
    assert {"numpy.empty", "pool", "pool+prefetch", "pool+prefetch(touch fallback)"} <= variants
    targeted = [c for c in report["comparisons"] if c["target"] is not None]
    assert targeted and all(c["candidate"].endswith("+prefetch") for c in targeted)
    assert all(c["ratio"] > 0 for c in report["comparisons"])


@pytest.mark.parametrize("size", ["12", "1T", "abc"])
def test_bad_sizes_are_refused(size, tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--size", size, "--json", str(tmp_path / "x.json")],
        capture_output=True, text=True, timeout=60, env=env, check=False,
    )
    assert result.returncode == 2
    assert "size" in result.stderr
    assert not (tmp_path / "x.json").exists()
