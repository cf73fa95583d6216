"""scripts/gpu_bench.sh and bench/python/bench_gpu.py (issue 28): the pure parts in process (case
selection, rank capping, the refit-plan probe, the Markdown table), and a --quick run end to end with
the CUDA cases against the fake CUDA runtime (stress tier)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench" / "python"))

import bench_gpu  # noqa: E402


def test_select_cases_keeps_the_table_order_and_names_unknown_cases():
    assert bench_gpu.select_cases("all") == list(bench_gpu.CASES)
    assert bench_gpu.select_cases("torch_backend, replay") == ["replay", "torch_backend"]
    with pytest.raises(ValueError, match="'replay,nope'"):
        bench_gpu.select_cases("replay,nope")
    with pytest.raises(ValueError, match="expected 'all' or a subset"):
        bench_gpu.select_cases(" , ")


@pytest.mark.parametrize("cores, kept, dropped", [
    (2, [2], [4, 8, 16]), (8, [2, 4, 8], [16]), (16, [2, 4, 8, 16], []), (1, [], [2, 4, 8, 16])])
def test_rank_counts_are_capped_at_the_cores(cores, kept, dropped):
    assert bench_gpu.cap_ranks(bench_gpu.HOST_RANKS, cores) == (kept, dropped)


def test_quick_runs_two_ranks_at_most_and_bad_arguments_are_usage_errors(capsys):
    assert bench_gpu.parse_args(["--quick", "--cores", "16"]).cores == 2
    assert bench_gpu.parse_args(["--cores", "16"]).cores == 16
    with pytest.raises(SystemExit) as exit_info:
        bench_gpu.parse_args(["--cases", "replay,gpu"])
    assert exit_info.value.code == 2
    assert "got 'replay,gpu'" in capsys.readouterr().err


def test_the_refit_plan_probe_finds_an_attribute_and_skips_missing_modules():
    assert bench_gpu.find_persistent_plan([("no_such_module_for_gpu_bench", "Plan"), ("json", "dumps")]) == \
        "json.dumps"
    assert bench_gpu.find_persistent_plan([("json", "NoSuchPlan"), ("no_such_module_for_gpu_bench", "Plan")]) is None


def test_the_refit_plan_row_is_a_skip_with_its_reason():
    args = bench_gpu.parse_args(["--cases", "refit_plan"])
    result = bench_gpu.run_case("refit_plan", args, Path("."))
    assert result["status"] == "skipped"
    assert "refit plan" in result["reason"] or "no case for it yet" in result["reason"]


def report(fake: bool) -> dict:
    return {"config": {"fake_cuda": fake}, "notes": ["a note"],
            "measurements": [
                {"case": "16 MiB", "variant": "tx", "metric": "time", "value": 2.0, "unit": "ms"},
                {"case": "16 MiB", "variant": "floor", "metric": "time", "value": 1.5, "unit": "ms"}],
            "comparisons": [{"case": "16 MiB", "metric": "time", "candidate": "tx", "baseline": "floor",
                             "ratio": 0.75, "target": 0.9, "met": False}]}


def document(fake: bool) -> dict:
    return {"quick": True, "fake_cuda": fake, "started": "now", "seconds": 12.0,
            "machine": {"gpu": "NVIDIA H100 80GB HBM3 (81559 MiB)", "driver": "580.159.04", "cuda": "13.0",
                        "cpu_model": "Some Xeon", "cores": 16, "torch": "2.11.0", "python": "3.12.3"},
            "cases": {"replay": {"status": "ok", "report": report(fake), "notes": ["capped"]},
                      "refit_plan": {"status": "skipped", "reason": "no persistent refit plan"},
                      "pipeline": {"status": "failed", "reason": "exit code 1: boom | here"}}}


def test_the_table_has_the_machine_a_row_per_comparison_and_the_skips():
    text = bench_gpu.markdown(document(fake=False))
    assert "- GPU: NVIDIA H100 80GB HBM3 (81559 MiB); driver 580.159.04; CUDA 13.0" in text
    assert "- CPU: Some Xeon, 16 cores; torch 2.11.0" in text
    assert "| replay transfer | 16 MiB, time | tx | floor | 2 ms | 1.5 ms | 0.75x | >= 0.9x | **NO** |" in text
    assert "| persistent refit plan | - | **skipped**: no persistent refit plan |" in text
    assert "**failed**: exit code 1: boom / here" in text  # a '|' would break the table
    assert "- replay transfer: a note" in text and "- replay transfer: capped" in text
    assert "fake CUDA runtime" not in text


def test_the_table_says_when_the_numbers_come_from_the_fake_runtime():
    text = bench_gpu.markdown(document(fake=True))
    assert "fake CUDA runtime" in text.splitlines()[2]
    assert "| 0.75x (fake) |" in text


@pytest.mark.multiprocess
@pytest.mark.stress
@pytest.mark.timeout(1200)  # the first run builds the fake extension (minutes on 2 cores)
def test_quick_run_end_to_end_with_the_fake_cuda_runtime(tmp_path):
    if not Path("/usr/local/cuda/include/cuda_runtime_api.h").exists():
        pytest.skip("no CUDA toolkit headers: the fake CUDA runtime cannot be built")
    env = dict(os.environ, OUT=str(tmp_path), PYTHON=sys.executable)
    result = subprocess.run(["bash", str(REPO / "scripts" / "gpu_bench.sh"), "--fake-cuda", "--quick"],
                            capture_output=True, text=True, env=env, timeout=1100)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    data = json.loads((tmp_path / "gpu_bench.json").read_text())
    cases = data["cases"]
    assert list(cases) == list(bench_gpu.CASES)
    for name in ("replay", "unified_memory", "cuda_all_reduce"):
        assert cases[name]["status"] == "ok", (name, cases[name])
        assert cases[name]["report"]["config"]["fake_cuda"] is True
        assert cases[name]["report"]["comparisons"], name
    assert cases["pipeline"]["status"] == "skipped" and "fake build" in cases["pipeline"]["reason"]
    assert cases["refit_plan"]["status"] == "skipped"
    for name in ("host_collectives", "torch_backend"):
        assert cases[name]["status"] == "ok", (name, cases[name])
        compared = {c["case"] for c in cases[name]["report"]["comparisons"]}
        assert compared and all(case.startswith("2 ranks") for case in compared), compared
        assert "4 ranks" not in json.dumps(cases[name]["report"]["measurements"])
    baselines = {c["baseline"] for c in cases["host_collectives"]["report"]["comparisons"]}
    assert {"gloo", "copy floor"} <= baselines
    assert "gloo" in {c["baseline"] for c in cases["torch_backend"]["report"]["comparisons"]}
    table = (tmp_path / "gpu_bench.md").read_text()
    assert "fake CUDA runtime" in table and "| host collectives |" in table
    assert "| CUDA all-reduce |" in table and "| replay transfer |" in table
    assert (tmp_path / "cases.log").stat().st_size > 0


def test_the_gpu_path_calls_tensorxfer_and_torch_as_they_are_declared():
    """The real-GPU path cannot run here: bind its calls to the signatures it will meet there, so a
    renamed or reordered parameter fails here instead of on a lent machine."""
    import inspect

    torch = pytest.importorskip("torch")
    from tensorxfer.inference import unified_memory as um
    from tensorxfer.ipc.replay_pipelines.transfer import TorchCopyReplayTransferBackend, build_replay_transfer_backend
    from tensorxfer.ipc.replay_pipelines.transfer.cuda_like import CudaLikeReplayTransferBackend
    from tensorxfer.runtime import CudaCommunicator, LocalGroup

    def binds(function, *args, **kwargs):
        inspect.signature(function).bind(*args, **kwargs)

    binds(build_replay_transfer_backend, device="cuda", ring_depth=2)
    binds(TorchCopyReplayTransferBackend, device="cuda", ring_depth=2)
    for backend in (CudaLikeReplayTransferBackend, TorchCopyReplayTransferBackend):
        binds(backend.register_host_slots, None, [])
        binds(backend.allocate_device_slots, None, count=2, shape=(8,), dtype=torch.uint8)
        binds(backend.submit_h2d, None, slot=0, dst=None, src=None, h2d_bytes=8)
        binds(backend.synchronize_ready, None, 0)
    binds(um.create_unified_mempool)
    binds(um.prefetch_managed_module_parameters, None, device=-1)
    binds(um.prefetch_managed_tensor, None, device=0)
    binds(um.advise_managed_tensor_preferred_location, None, device=0)
    binds(um.advise_managed_tensor_accessed_by, None, device=0)
    binds(CudaCommunicator, None)
    binds(CudaCommunicator.all_reduce, None, None)
    binds(LocalGroup.join, "name", rank=0, world_size=2, timeout=120)
    binds(torch.cuda.use_mem_pool, None)
    import bench_cuda_pipeline

    binds(bench_cuda_pipeline._rank, "name", 0, 3, None)
    assert [size for _, _, size in bench_cuda_pipeline.CASES][-1] == 16 << 20


def test_without_a_gpu_the_torch_machine_says_so():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    import _gpu_machines

    with pytest.raises(RuntimeError, match="no GPU"):
        _gpu_machines.TorchGpu()
