#!/usr/bin/env bash
# The tests: GoogleTest (ctest), the type stub, mypy, ruff, and pytest against the package
# installed into a virtual environment. Installs what is missing first.
#   scripts/test.sh [--tier fast|full|stress|all] [--fresh] [extra pytest arguments]
# --tier   which tests (tests/python/conftest.py; default fast, a few minutes warm):
#            fast    every in-process test and one 2-rank case per subsystem
#            full    everything but the stress cases (CI)
#            stress  10k-iteration and large-world cases, simulated hosts, benchmark smoke
#                    tests (before a release; Python only)
#            all     full and stress
# --fresh  a new virtual environment and clean build directories, as on a new machine (CI
#          passes it): otherwise the environment is kept while the dependency spec and the
#          torch version are unchanged, and the builds are incremental.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

tier=${TENSORXFER_TEST_TIER:-fast} fresh=0
pytest_args=()
while [ $# -gt 0 ]; do
  case $1 in
    --tier) tier=$2; shift 2 ;;
    --tier=*) tier=${1#--tier=}; shift ;;
    --fresh) fresh=1; shift ;;
    *) pytest_args+=("$1"); shift ;;
  esac
done
case $tier in fast|full|stress|all) ;; *) echo "usage: $0 [--tier fast|full|stress|all] [--fresh] [pytest args]" >&2; exit 2 ;; esac

BUILD=$TOP/build
VENV=$BUILD/test-venv
mkdir -p "$BUILD"
install_debian_packages
if [ "$fresh" = 1 ]; then
  log "--fresh: removing $BUILD/cpp-tests and the package's build directory"
  rm -rf "$BUILD/cpp-tests" "$BUILD"/cp3*
fi
reuse_or_make_venv "$VENV" "torch,test" "$fresh"

# The C++ tests take seconds to run (every tier but stress runs all of them), but their build
# is the longest step of a fresh run: it compiles in the background at the lowest CPU priority
# while the Python tests run (their ranks leave the cores idle much of the time), and ctest
# runs after pytest.
cpp_build_log=$BUILD/cpp-tests-build.log
cpp_build=""
if [ "$tier" != stress ]; then
  log "C++ tests: building in the background (log: $cpp_build_log)"
  # With the project's own DLPack declaration whatever the system has, as a machine without
  # libdlpack-dev builds it; DlpackAbiTest compares it with the system header when there is one.
  # The C++ benchmarks are not built here: -DTENSORXFER_BUILD_BENCH=ON builds them on request.
  background_at_lowest_priority "$cpp_build_log" bash -c "cmake -S '$TOP' -B '$BUILD/cpp-tests' -G Ninja \
      -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTENSORXFER_BUILD_TESTS=ON -DTENSORXFER_BUILD_BENCH=OFF \
      -DTENSORXFER_BUILD_PYTHON=OFF -DTENSORXFER_USE_SYSTEM_DLPACK=OFF && cmake --build '$BUILD/cpp-tests' -j2"
  cpp_build=$BACKGROUND_PID
  trap 'kill -- -"$cpp_build" 2>/dev/null || true' EXIT
fi

cd "$TOP"
if [ "$tier" != stress ]; then
  log "lint (ruff), type stub and annotations (pybind11-stubgen, mypy)"
  "$VENV/bin/python" -m ruff check
  PYTHON="$VENV/bin/python" bash "$TOP/scripts/gen_stubs.sh" --installed --check
  # Against the installed package (py.typed and _core.pyi), then the sources and the examples
  # ([tool.mypy] in pyproject.toml); the cache is kept beside the environment.
  "$VENV/bin/python" -m mypy --cache-dir "$BUILD/mypy-cache" examples
  "$VENV/bin/python" -m mypy --cache-dir "$BUILD/mypy-cache"
fi

log "Python tests (pytest on the installed package, tier $tier)"
# Run from the checkout with the sources off sys.path: `tensorxfer` must come from the venv.
"$VENV/bin/python" - <<'PY'
import os, sys, tensorxfer
where = os.path.dirname(tensorxfer.__file__)
assert "site-packages" in where, f"tensorxfer imported from {where}, not the installed package"
print(f"testing tensorxfer {tensorxfer.__version__} installed at {where}", file=sys.stderr)
PY
# The full tier runs on pytest-xdist workers, one per CPU up to 4 (TENSORXFER_TEST_WORKERS
# overrides; 0: in this process), a test file to a worker: its multi-process tests leave the
# cores idle while ranks wait on each other (2 workers on 2 CPUs: 468 s against 657 s). Each
# worker takes a /dev/shm of its own (a mount namespace, tests/python/conftest.py), which needs
# root; without it the tests run in one process. The stress tier's timings were measured alone.
default_workers=0
[ "$tier" = full ] && [ "$(id -u)" = 0 ] && default_workers=$(( $(nproc) < 4 ? $(nproc) : 4 ))
workers=${TENSORXFER_TEST_WORKERS:-$default_workers}
parallel=()
[ "$workers" -gt 1 ] && parallel=(-n "$workers" --dist loadfile)
pytest_status=0
"$VENV/bin/python" -m pytest tests/python -p no:cacheprovider --tier "$tier" "${parallel[@]}" "${pytest_args[@]}" \
  || pytest_status=$?

ctest_status=0
if [ -n "$cpp_build" ]; then
  log "C++ tests (GoogleTest via ctest): waiting for the build"
  if wait "$cpp_build"; then
    # Two at a time; the tests labelled shm-sweep run alone (RUN_SERIAL, see CMakeLists.txt).
    (cd "$BUILD/cpp-tests" && ctest -j2 --output-on-failure --timeout 300) || ctest_status=$?
  else
    ctest_status=$?
    tail -n 60 "$cpp_build_log" >&2
    log "the C++ test build failed (whole log: $cpp_build_log)"
  fi
fi
[ "$pytest_status" = 0 ] || log "pytest failed (exit $pytest_status)"
[ "$ctest_status" = 0 ] || log "the C++ tests failed (exit $ctest_status)"
[ "$pytest_status" = 0 ] && [ "$ctest_status" = 0 ]
