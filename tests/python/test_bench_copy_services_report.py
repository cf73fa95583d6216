"""bench_copy_services.py's comparisons: the shm backend against the best of each baseline family."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "python" / "bench_copy_services.py"


def load_bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_copy_services_under_test", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_shm_is_compared_with_the_fastest_of_each_family_and_its_targets() -> None:
    bench = load_bench()
    mpi_job = {case: {"tensorxfer mpi (first run)": [50.0], "tensorxfer mpi (repeat)": [40.0],
                      "tensorxfer shm (first run)": [20.0], "tensorxfer shm (repeat)": [10.0],
                      "mpi4py Isend/Irecv w16": [45.0], "mpi4py Isend/Irecv wall": [30.0]} for case in "abc"}
    torch_job = {case: {"tensorxfer torch (first run)": [60.0], "tensorxfer torch (repeat)": [16.0],
                        "gloo batch_isend_irecv w1024": [250.0], "gloo batch_isend_irecv wall": [150.0]}
                 for case in "abc"}
    report = bench.build_report(["a", "b", "c"], 1, mpi_job, torch_job, ranks=4)
    shm = {(c.case[:3], c.baseline): c for c in report.comparisons if c.candidate == "tensorxfer shm (repeat)"}
    a, b, c = "(a)", "(b)", "(c)"
    # (a): 30 ms best mpi4py window -> 3x < 4x; 150 ms best gloo window -> 15x < 30x.
    assert shm[a, "mpi4py Isend/Irecv wall"].ratio == pytest.approx(3.0)
    assert (shm[a, "mpi4py Isend/Irecv wall"].target, shm[a, "mpi4py Isend/Irecv wall"].met) == (4.0, False)
    assert shm[a, "gloo batch_isend_irecv wall"].ratio == pytest.approx(15.0)
    assert shm[a, "gloo batch_isend_irecv wall"].target == 30.0
    # (b): 3x the best mpi4py window meets 1.5x.
    assert (shm[b, "mpi4py Isend/Irecv wall"].target, shm[b, "mpi4py Isend/Irecv wall"].met) == (1.5, True)
    # (c): the best other backend of the project is torch's 16 ms -> 1.6x >= 1.5x.
    ours = shm[c, "tensorxfer torch (repeat)"]
    assert ours.ratio == pytest.approx(1.6) and (ours.target, ours.met) == (1.5, True)
    assert (c, "tensorxfer mpi (repeat)") not in shm
    assert "4 ranks" in report.title


def test_without_shm_results_only_the_older_comparisons_are_made() -> None:
    bench = load_bench()
    mpi_job = {"a": {"tensorxfer mpi (first run)": [50.0], "tensorxfer mpi (repeat)": [40.0],
                     "mpi4py Isend/Irecv w16": [80.0]}}
    report = bench.build_report(["a"], 1, mpi_job, {})
    assert {c.candidate for c in report.comparisons} == {"tensorxfer mpi (repeat)", "tensorxfer mpi (first run)"}
    repeat = next(c for c in report.comparisons if c.candidate == "tensorxfer mpi (repeat)")
    assert repeat.ratio == pytest.approx(2.0) and (repeat.target, repeat.met) == (3.0, False)


def test_shm_is_compared_with_the_floors_measured_in_the_same_run() -> None:
    bench = load_bench()
    mpi_job = {"a": {"tensorxfer shm (first run)": [20.0], "tensorxfer shm (repeat)": [10.0],
                     bench.FLOOR_MEMCPY: [5.0], bench.FLOOR_CMA: [8.0]},
               "b": {"tensorxfer shm (first run)": [120.0], "tensorxfer shm (repeat)": [100.0],
                     bench.BUFFERED: [60.0], bench.FLOOR_MEMCPY: [50.0], bench.FLOOR_CMA: [95.0]}}
    report = bench.build_report(["a", "b"], 1, mpi_job, {})
    floors = {(c.case[:3], c.candidate, c.baseline): c for c in report.comparisons
              if c.baseline.startswith("floor")}
    a = floors["(a)", "tensorxfer shm (repeat)", bench.FLOOR_MEMCPY]
    assert a.ratio == pytest.approx(0.5) and (a.target, a.met) == (0.4, True)  # within 2.5x
    b = floors["(b)", "tensorxfer shm (repeat)", bench.FLOOR_CMA]
    assert b.ratio == pytest.approx(0.95) and (b.target, b.met) == (0.9, True)
    buffered = floors["(b)", bench.BUFFERED, bench.FLOOR_MEMCPY]
    assert buffered.ratio == pytest.approx(50 / 60) and (buffered.target, buffered.met) == (0.8, True)
    assert len(floors) == 3


@pytest.mark.parametrize("cma_ms,how,best", [(8.0, "a cross-memory read per tensor", 5.0 / 18.0),
                                             (None, "two copies", 5.0 / 20.0), (30.0, "two copies", 5.0 / 20.0)])
def test_case_a_notes_the_best_ratio_its_unavoidable_parts_leave(cma_ms, how, best) -> None:
    bench = load_bench()
    variants = {"tensorxfer shm (repeat)": [30.0], bench.FLOOR_MEMCPY: [5.0], bench.PART_NO_OP: [2.0],
                bench.PART_TORCH_READS: [9.0], bench.PART_BARE_LOOP: [1.0]}
    if cma_ms is not None:
        variants[bench.FLOOR_CMA_PIECES] = [cma_ms]
    report = bench.build_report(["a"], 1, {"a": variants}, {})
    notes = [n for n in report.notes if "best reachable" in n]
    # calls 2 + reads 9 - their loop 1 + moving the bytes: the faster of two memcpys (10) and the reads (cma)
    assert len(notes) == 1 and how in notes[0] and f"{best:.2f}x" in notes[0] and "target 0.4x" in notes[0]


def test_case_a_notes_nothing_without_its_parts() -> None:
    bench = load_bench()
    report = bench.build_report(["a"], 1, {"a": {"tensorxfer shm (repeat)": [30.0], bench.FLOOR_MEMCPY: [5.0]}}, {})
    assert not [n for n in report.notes if "best reachable" in n]
