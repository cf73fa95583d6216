"""The replay benchmark runs end to end in --quick mode and writes a table, JSON and a PNG."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tensorxfer import _core
from tensorxfer.benchmarks.report import Report, cpu_header, percentile, time_interleaved

REPO = Path(__file__).resolve().parents[2]


def test_percentile_and_median_interpolate():
    assert percentile([1.0, 2.0, 3.0, 4.0, 5.0], 50) == 3.0
    assert percentile([0.0, 10.0], 25) == 2.5
    assert percentile([4.0], 99) == 4.0
    with pytest.raises(ValueError, match="empty"):
        percentile([], 50)


def test_report_ratio_direction_and_target():
    report = Report("t")
    report.add("case", "fast", "time", [1.0, 1.0, 9.0], "ms", lower_is_better=True)
    report.add("case", "slow", "time", [4.0, 4.0, 4.0], "ms", lower_is_better=True)
    report.add("case", "fast", "rate", [10.0], "GB/s", lower_is_better=False)
    report.add("case", "slow", "rate", [2.0], "GB/s", lower_is_better=False)
    timed = report.compare("case", "time", "fast", "slow", target=5.0)
    assert timed.ratio == pytest.approx(4.0) and timed.met is False  # median 1 ms vs 4 ms
    rated = report.compare("case", "rate", "fast", "slow", target=5.0)
    assert rated.ratio == pytest.approx(5.0) and rated.met is True
    table = report.table()
    assert "4.00x" in table and ">= 5x" in table and "NO" in table and "yes" in table
    with pytest.raises(KeyError, match="variant='missing'"):
        report.compare("case", "time", "missing", "slow")


def test_every_table_names_the_cpu_its_simd_flags_and_what_the_kernels_use():
    table = Report("t").table()
    header = table.splitlines()[1]
    cpu = _core.cpu_features()
    assert header == cpu_header() and header.startswith("CPU: ")
    assert f"family {cpu['family']} model {cpu['model']}" in header
    assert f"AVX2 {'yes' if cpu['avx2'] else 'no'}, AVX-512 {'yes' if cpu['avx512'] else 'no'}" in header
    assert f"kernels {cpu['vector_set']};" in header and f"{cpu['usable_cpus']} CPUs" in header


def test_the_cpu_header_marks_what_was_forced():
    code = "from tensorxfer.benchmarks.report import cpu_header; print(cpu_header())"
    env = dict(os.environ, TENSORXFER_CPU_VECTOR_SET="baseline", TENSORXFER_CPU_COUNT="3")
    header = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                            check=True).stdout.strip()
    assert "kernels baseline (forced)" in header and "3 CPUs (forced)" in header


def test_time_interleaved_rotates_order():
    calls: list[str] = []
    samples = time_interleaved({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")},
                               repeats=2, warmup=0)
    assert calls == ["a", "b", "b", "a"]
    assert [len(v) for v in samples.values()] == [2, 2]


@pytest.mark.multiprocess
@pytest.mark.stress
def test_bench_quick_writes_table_json_and_png(tmp_path):
    script = REPO / "bench" / "python" / "bench_replay.py"
    command = [sys.executable, str(script)] if script.exists() else [sys.executable, "-m", "tensorxfer", "bench"]
    result = subprocess.run([*command, "--quick", "--out", str(tmp_path)], capture_output=True, text=True,
                            timeout=110, env=os.environ.copy())
    assert result.returncode == 0, result.stderr
    assert "ratios (>1 = tensorxfer better)" in result.stdout
    data = json.loads((tmp_path / "bench_replay_quick.json").read_text())
    cases = {c["case"].split()[0] + " " + c["case"].split()[1] for c in data["comparisons"]}
    assert {"pack 512", "host copy", "handoff latency", "handoff throughput"} <= cases
    for comparison in data["comparisons"]:
        assert comparison["ratio"] > 0
        if comparison["target"] is not None:
            assert comparison["met"] == (comparison["ratio"] >= comparison["target"])
    assert data["machine"]["cpus"] >= 1
    png = tmp_path / "bench_replay_quick.png"
    pytest.importorskip("matplotlib")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_module_rejects_unknown_case(tmp_path):
    result = subprocess.run([sys.executable, "-m", "tensorxfer", "bench", "--cases", "pack,nope",
                             "--out", str(tmp_path)], capture_output=True, text=True, timeout=60,
                            env=os.environ.copy())
    assert result.returncode == 2
    assert "expected a subset of pack, copy, device_copy, handoff" in result.stderr
