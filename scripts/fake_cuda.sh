#!/usr/bin/env bash
# The CUDA paths without a GPU (issue 18), run by .ci/run on every submission:
#  1. the core's CUDA files and a test variant of the extension built against the fake
#     CUDA runtime (tests/cuda_fake, -DTENSORXFER_FAKE_CUDA=ON) into build/fake-cuda;
#  2. its GoogleTest binaries (the fake itself, the CUDA paths, the GPU tests of
#     cuda_copy and managed memory, which the fake's device lets run);
#  3. the Python tests of the core's CUDA entry points against that variant;
#  4. the CUDA <= 12 branches compiled (not linked) against CUDA 12 headers from PyPI.
#   scripts/fake_cuda.sh [--build-only | --tests-only] [PYTHON]
#     PYTHON     builds the extension and runs the Python tests (default: build/test-venv/bin/python,
#                else python3); it needs pybind11, numpy, pytest and pytest-timeout
#     --build-only   the compiling steps 1 and 4 (CI runs them niced, in the background)
#     --tests-only   the test steps 2 and 3, after a --build-only with the same PYTHON
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
use_compiler_cache

BUILD=$TOP/build/fake-cuda
build=1 tests=1
case ${1:-} in
  --build-only) tests=0; shift ;;
  --tests-only) build=0; shift ;;
esac
PYTHON=${1:-}
if [ -z "$PYTHON" ]; then
  if [ -x "$TOP/build/test-venv/bin/python" ]; then PYTHON=$TOP/build/test-venv/bin/python; else PYTHON=python3; fi
fi
# A path given relative to the caller's folder still works after the cd of step 3.
case $PYTHON in */*) PYTHON=$(cd "$(dirname "$PYTHON")" && pwd)/$(basename "$PYTHON") ;; esac
CUDA_INCLUDE=$(ls -d /usr/local/cuda/include /usr/local/cuda-*/include 2>/dev/null | head -n1 || true)
if [ -z "$CUDA_INCLUDE" ]; then
  log "no CUDA toolkit headers (/usr/local/cuda*/include): the fake CUDA runtime needs them; skipping steps 1-3"
else
  TESTS=(fake_cuda_test cuda_paths_test cuda_copy_test managed_test)
  if [ "$build" = 1 ]; then
    log "fake CUDA runtime: configure and build $BUILD"
    "$PYTHON" -c "import pybind11" 2>/dev/null || "$PYTHON" -m pip install -q pybind11
    cmake -S "$TOP" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTENSORXFER_FAKE_CUDA=ON \
      -DTENSORXFER_BUILD_TESTS=ON -DTENSORXFER_BUILD_PYTHON=ON -DTENSORXFER_USE_SYSTEM_DLPACK=OFF \
      -DPython_EXECUTABLE="$("$PYTHON" -c 'import sys; print(sys.executable)')" \
      -Dpybind11_DIR="$("$PYTHON" -m pybind11 --cmakedir)" >/dev/null
    cmake --build "$BUILD" -j2 --target "${TESTS[@]}" _core
  fi
  if [ "$tests" = 1 ]; then
    log "fake CUDA runtime: C++ tests"
    for test in "${TESTS[@]}"; do "$BUILD/$test" --gtest_brief=1; done

    log "fake CUDA runtime: Python tests of the core's CUDA entry points"
    extension=$(ls "$BUILD"/_core*.so | head -n1)
    (cd "$TOP/tests/cuda_fake/python" && TENSORXFER_FAKE_CUDA_EXTENSION=$extension \
      "$PYTHON" -m pytest -q -p no:cacheprovider --timeout=120 .)
  fi
fi
[ "$build" = 1 ] || { log "fake CUDA runtime tests passed"; exit 0; }

log "CUDA <= 12 branches: compile only, against nvidia-cuda-runtime-cu12 (+ crt headers of nvidia-cuda-nvcc-cu12)"
CU12=$TOP/build/cuda12-headers
if [ ! -f "$CU12/nvidia/cuda_runtime/include/cuda_runtime_api.h" ] || [ ! -f "$CU12/nvidia/cuda_nvcc/include/crt/host_defines.h" ]; then
  rm -rf "$CU12" && mkdir -p "$CU12/wheels"
  "$PYTHON" -m pip download -q --no-deps -d "$CU12/wheels" "nvidia-cuda-runtime-cu12==12.9.*" "nvidia-cuda-nvcc-cu12==12.9.*"
  # Only the headers are needed: the runtime's include/ and nvcc's include/crt (host_defines.h).
  "$PYTHON" - "$CU12" <<'PY'
import glob, sys, zipfile
root = sys.argv[1]
for wheel in glob.glob(f"{root}/wheels/*.whl"):
    with zipfile.ZipFile(wheel) as archive:
        for name in archive.namelist():
            if "/include/" in name:
                archive.extract(name, root)
PY
fi
grep -q "define CUDART_VERSION  *12" "$CU12/nvidia/cuda_runtime/include/cuda_runtime_api.h"
PY_INCLUDES=(-I"$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')")
PY_INCLUDES+=(-I"$("$PYTHON" -c 'import pybind11; print(pybind11.get_include())')")
for source in cpp/src/common/cuda_check.cc cpp/src/common/cuda_device_guard.cc cpp/src/runtime/cuda_copy.cc \
              cpp/src/memory/managed.cc cpp/src/collectives/ipc_memory_cuda.cc cpp/bindings/bind_cuda.cc \
              cpp/bindings/bind_memory.cc; do
  g++ -std=c++17 -fsyntax-only -fvisibility=hidden -Wall -Wextra -Werror -Wno-unused-parameter -DTENSORXFER_WITH_CUDA=1 \
    -I"$TOP/cpp/include" -I"$TOP/cpp/bindings" -I"$CU12/nvidia/cuda_runtime/include" \
    -I"$CU12/nvidia/cuda_nvcc/include" "${PY_INCLUDES[@]}" "$TOP/$source"
done
log "fake CUDA runtime and CUDA 12 compile checks passed"
