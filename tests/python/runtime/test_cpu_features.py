"""The CPU branches can be forced (TENSORXFER_CPU_VECTOR_SET, _CACHE_BYTES, _COUNT), so that
one machine runs what an AVX2-only CPU, a smaller cache or fewer cores would run: each override
reaches every path that branches on it, the forced kernels still copy and reduce correctly,
and an invalid value fails the import instead of passing silently.

Every case runs in a child process: the features are read once per process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tensorxfer import _core

HAS = _core.cpu_features()
SETS_THIS_CPU_RUNS = ["baseline"] + (["avx2"] if HAS["avx2"] else []) + (["avx512"] if HAS["avx512"] else [])


def run_child(code: str, **env: str) -> subprocess.CompletedProcess:
    environment = {key: value for key, value in os.environ.items() if not key.startswith("TENSORXFER_CPU_")}
    environment.update(env)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=environment, capture_output=True,
                          text=True, timeout=120)


def child_json(code: str, **env: str) -> dict:
    done = run_child(code, **env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


REPORT = """
    import json
    from tensorxfer import _core
    engine = _core.CopyEngine(0)
    print(json.dumps({"features": dict(_core.cpu_features()), "half": _core.half_kernel_sets(),
                      "best_half": _core.best_half_kernels(), "workers": engine.num_threads,
                      "parallelism": engine.max_parallelism}))
"""


def test_the_defaults_are_what_the_cpu_reports():
    report = child_json(REPORT)
    features = report["features"]
    assert not (features["vector_set_forced"] or features["cache_forced"] or features["cpus_forced"])
    assert features["vector_set"] == SETS_THIS_CPU_RUNS[-1]
    assert features["usable_cpus"] == len(os.sched_getaffinity(0))
    assert features["override_error"] == ""
    if sys.platform == "linux" and os.uname().machine == "x86_64":
        assert features["vendor"] and features["family"] > 0
    with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
        text = cpuinfo.read()
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    if flags:  # the CPUID reading agrees with the kernel's
        assert features["avx2"] == ("avx2" in flags and "fma" in flags and "f16c" in flags)
        assert features["avx512"] == (features["avx2"] and "avx512f" in flags)
        family = next(line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("cpu family"))
        model = next(line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model\t"))
        assert (features["family"], features["model"]) == (int(family), int(model))


@pytest.mark.parametrize("vector_set", SETS_THIS_CPU_RUNS)
def test_a_forced_vector_set_caps_every_kernel_choice(vector_set):
    report = child_json(REPORT, TENSORXFER_CPU_VECTOR_SET=vector_set)
    assert report["features"]["vector_set"] == vector_set
    assert report["features"]["vector_set_forced"] == (vector_set != SETS_THIS_CPU_RUNS[-1])
    expected_half = {"baseline": ["portable"], "avx2": ["portable", "avx2"],
                     "avx512": ["portable", "avx2", "avx512"]}[vector_set]
    assert report["half"] == expected_half
    assert report["best_half"] == expected_half[-1]


def test_a_vector_set_the_cpu_lacks_is_not_turned_on():
    if HAS["avx512"]:
        pytest.skip("this CPU has every vector set the kernels use (AVX-512), so none can be asked for beyond it")
    report = child_json(REPORT, TENSORXFER_CPU_VECTOR_SET="avx512")
    assert report["features"]["vector_set"] == SETS_THIS_CPU_RUNS[-1]
    assert "avx512" not in report["half"]


def test_forced_cache_and_cpu_count_reach_the_copy_engine_and_the_spin_choice():
    report = child_json(REPORT, TENSORXFER_CPU_CACHE_BYTES=str(3 << 20), TENSORXFER_CPU_COUNT="5")
    features = report["features"]
    assert (features["last_level_cache_bytes"], features["cache_forced"]) == (3 << 20, True)
    assert (features["usable_cpus"], features["cpus_forced"]) == (5, True)
    assert (report["parallelism"], report["workers"]) == (5, 4)
    one = child_json(REPORT, TENSORXFER_CPU_COUNT="1")
    assert (one["parallelism"], one["workers"]) == (2, 1)  # at least one worker beside the caller


@pytest.mark.parametrize("name, value", [("TENSORXFER_CPU_VECTOR_SET", "avx3"), ("TENSORXFER_CPU_CACHE_BYTES", "0"),
                                         ("TENSORXFER_CPU_CACHE_BYTES", "32M"), ("TENSORXFER_CPU_COUNT", "-2")])
def test_an_invalid_override_fails_the_import_naming_it(name, value):
    done = run_child("import tensorxfer", **{name: value})
    assert done.returncode == 1
    assert f"ValueError: tensorxfer: {name}={value}: expected" in done.stderr


# Kernels that branch on the vector set or the cache size, checked against numpy in the child:
# streaming copies (SSE2 or AVX2 bodies, unaligned heads and tails), row packing past the
# streaming threshold, and the float32 / bfloat16 / float16 reductions.
KERNELS = """
    import numpy as np
    from tensorxfer import _core
    rng = np.random.default_rng(7)
    engine = _core.CopyEngine(0)
    source = rng.integers(0, 256, size=(24 << 20) + 129, dtype=np.uint8)
    for offset in (0, 1, 63):
        target = np.zeros(source.size - offset, dtype=np.uint8)
        engine.copy(target, source[offset:])
        assert np.array_equal(target, source[offset:]), offset
    from tensorxfer.ipc.pack import PackLayout, pack_rows
    store = {"obs": rng.standard_normal((4096, 1024)).astype(np.float32),
             "reward": rng.standard_normal(4096).astype(np.float32)}
    rows = rng.integers(0, 4096, size=3000)
    layout = PackLayout({"obs": ("float32", (1024,)), "reward": ("float32", ())}, rows=rows.size)
    packed = np.zeros(layout.nbytes, dtype=np.uint8)
    pack_rows(packed, layout, store, rows, engine)
    for name, data in store.items():
        begin = layout.offsets[name]
        got = packed[begin:begin + rows.size * layout.row_nbytes[name]].view(np.float32)
        assert np.array_equal(got.reshape(data[rows].shape), data[rows]), name
    for dtype in ("float32", "bfloat16", "float16"):
        words = [rng.standard_normal(4099).astype(np.float32) for _ in range(3)]
        if dtype == "float32":
            sources, expected = words, words[0] + words[1] + words[2]
        else:
            half = np.float16 if dtype == "float16" else None
            if half is None:  # bfloat16: the upper half of float32 (exactly representable inputs)
                sources = [(w.view(np.uint32) >> 16).astype(np.uint16) for w in words]
            else:
                sources = [w.astype(np.float16).view(np.uint16) for w in words]
            expected = None
        out = np.empty_like(sources[0])
        _core.reduce_elements(dtype, "sum", sources, out, 1, "auto")
        if expected is not None:
            assert np.array_equal(out, expected)
        else:
            portable = np.empty_like(out)
            _core.reduce_elements(dtype, "sum", sources, portable, 1, "portable")
            assert np.array_equal(out, portable), dtype
    print("{}")
"""


@pytest.mark.parametrize("vector_set", SETS_THIS_CPU_RUNS)
@pytest.mark.parametrize("cache", ["reported", str(256 << 10)])
def test_forced_kernels_copy_pack_and_reduce_correctly(vector_set, cache):
    env = {"TENSORXFER_CPU_VECTOR_SET": vector_set}
    if cache != "reported":
        env["TENSORXFER_CPU_CACHE_BYTES"] = cache
    assert child_json(KERNELS, **env) == {}
