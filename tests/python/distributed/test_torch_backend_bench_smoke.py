"""bench/python/bench_torch_backend.py's simulated-hosts case runs end to end and prints every collective's row."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from child_process import child_environment
from conftest import torch_or_skip

torch_or_skip()

from simulated_hosts import unavailable_reason  # noqa: E402

BENCH = Path(__file__).resolve().parents[3] / "bench" / "python" / "bench_torch_backend.py"
VARIANTS = {"tensorxfer", "gloo", "cross_step_only", "in_host_steps_only"}


@pytest.mark.stress
@pytest.mark.multiprocess
@pytest.mark.timeout(300)
@pytest.mark.skipif(unavailable_reason() is not None, reason=str(unavailable_reason()))
def test_bench_hosts_case_times_every_collective_beside_its_floors(tmp_path):
    done = subprocess.run([sys.executable, str(BENCH), "--only-hosts", "--quick", "--repeats", "1",
                           "--host-sizes", "64K", "--out", str(tmp_path)],
                          env=child_environment(), capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stderr[-4000:]
    # The header (the torch version, the title, then Report.table's CPU line) names the CPU.
    assert any(line.startswith("CPU: ") and "family" in line for line in done.stdout.splitlines()[:3]), done.stdout[:400]
    report = json.loads((tmp_path / "torch_backend.json").read_text())
    variants: dict = {}
    for measured in report["measurements"]:
        variants.setdefault(measured["case"], set()).add(measured["variant"])
    label = "2 hosts x 2 ranks"
    expected = [f"{label} float32 64 KiB", f"{label} bfloat16 64 KiB", f"{label} barrier"] + [
        f"{label} {name} float32 64 KiB" for name in ("all_gather", "reduce_scatter", "broadcast")]
    for case in expected:
        assert variants.get(case) == VARIANTS, (case, variants.get(case))
    for case in expected:  # the floors' note beside each
        assert any(note.startswith(f"{case}: its steps alone") for note in report["notes"]), case
