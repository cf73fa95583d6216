#!/usr/bin/env bash
# Every CUDA path on a machine with a GPU: builds the core, the extension and the C++ tests
# with CUDA, runs the C++ tests that touch CUDA, the CUDA tests of the Python suite and the
# CUDA case of the replay benchmark. Meant for a lent GPU machine, where nothing can be
# fetched: it uses the machine's python3 (with torch, pybind11, pytest), and builds
# googletest from GTEST_SOURCES (default: .gpu-carry/googletest, a copy of
# /usr/src/googletest) when no GTest package is installed. Logs go to $OUT (default
# /tmp/gpu_check); each step's result is one line of $OUT/summary.txt.
#   OUT=DIR [BENCH=0] scripts/gpu_check.sh [pytest arguments replacing the default selection]
# BENCH=0 skips the benchmark step.
set -uo pipefail
TOP=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$TOP"
OUT=${OUT:-/tmp/gpu_check}
BUILD=${BUILD:-/tmp/tensorxfer-gpu-build}
GTEST_SOURCES=${GTEST_SOURCES:-$TOP/.gpu-carry/googletest}
JOBS=$(nproc)
mkdir -p "$OUT"
: >"$OUT/summary.txt"

step() {  # step NAME COMMAND...: runs it, logs to $OUT/NAME.log, records the exit status
  local name=$1; shift
  local start=$SECONDS
  printf '==> %s\n' "$name"
  "$@" >"$OUT/$name.log" 2>&1 </dev/null
  local status=$?
  printf '%-14s exit %d in %d s\n' "$name" "$status" $((SECONDS - start)) | tee -a "$OUT/summary.txt"
  tail -n 25 "$OUT/$name.log"
  return $status
}

machine() {
  nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv
  nvcc --version | tail -n 2
  python3 -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0), "nccl", torch.distributed.is_nccl_available())'
  lscpu | grep -m1 'Model name'
  nproc
  g++ --version | head -n 1
  echo "libstdc++ the linker finds: $(g++ -print-file-name=libstdc++.so) $(g++ -print-file-name=libstdc++.a)"
}

googletest() {
  if [ -d /tmp/gtest ]; then return 0; fi
  cmake -S "$GTEST_SOURCES" -B /tmp/gtest-build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_POLICY_VERSION_MINIMUM=3.5 \
    -DCMAKE_INSTALL_PREFIX=/tmp/gtest -DBUILD_GMOCK=OFF &&
    cmake --build /tmp/gtest-build -j"$JOBS" && cmake --install /tmp/gtest-build
}

build() {
  cmake -S "$TOP" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTENSORXFER_WITH_CUDA=ON \
    -DTENSORXFER_BUILD_TESTS=ON -DTENSORXFER_BUILD_BENCH=OFF -DTENSORXFER_BUILD_PYTHON=ON \
    -DTENSORXFER_USE_SYSTEM_DLPACK=OFF -DPython_EXECUTABLE="$(command -v python3)" \
    -DCMAKE_PREFIX_PATH="/tmp/gtest;$(python3 -m pybind11 --cmakedir)" &&
    cmake --build "$BUILD" -j"$JOBS"
}

cpp_tests() {  # the C++ tests whose code calls the CUDA runtime, each binary in turn
  local failed=0
  for test in cuda_copy_test ipc_memory_test managed_test advice_test copy_engine_test \
              tensor_view_test dlpack_abi_test numa_test element_math_test; do
    "$BUILD/$test" --gtest_brief=1 || failed=1
  done
  return $failed
}

python_tests() {
  export PYTHONPATH=$TOP/python PYTHONUNBUFFERED=1
  python3 -c 'from tensorxfer import _core; print(_core.cuda_status())'
  if [ $# -gt 0 ]; then
    python3 -m pytest -p no:cacheprovider -q "$@"
    return
  fi
  python3 -m pytest -p no:cacheprovider -q -m cuda tests/python
  local cuda_marked=$?
  # The unmarked tests whose path changes when a device is present (a skip, or a branch);
  # the cuda-marked ones (the copy service over nccl, CudaCommunicator) ran above.
  python3 -m pytest -p no:cacheprovider -q tests/python/runtime/test_ipc_memory.py \
    tests/python/inference/test_host_mempool.py tests/python/inference/test_unified_memory_modules.py \
    tests/python/inference/test_host_paths_without_cuda.py tests/python/ipc/replay_pipelines/test_factory.py \
    tests/python/test_cli.py tests/python/test_cuda_availability.py tests/python/test_extension_exports.py
  local cuda_aware=$?
  return $((cuda_marked | cuda_aware))
}

exports() {  # what the module exports (only its entry points and inline templates)
  nm -D --defined-only -C "$TOP"/python/tensorxfer/_core*.so | awk '{$1=""; print}' | cut -c1-100 | sort | uniq -c | sort -rn
}

bench() {
  PYTHONPATH=$TOP/python python3 bench/python/bench_replay.py --cases copy,device_copy --out "$OUT"
}

step machine machine
step googletest googletest || exit 1
step build build || exit 1
step exports exports
step cpp_tests cpp_tests
step python_tests python_tests "$@"
if [ "${BENCH:-1}" != 0 ]; then step bench bench; fi
cat "$OUT/summary.txt"
