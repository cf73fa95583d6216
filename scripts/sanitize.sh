#!/usr/bin/env bash
# The C++ tests under AddressSanitizer + UndefinedBehaviorSanitizer (all of them) and
# ThreadSanitizer (the concurrent parts: rings, futex waits, streams/events, copy engine).
#   scripts/sanitize.sh [address|thread|all] [--build-only]
# --build-only builds without running (CI builds these trees while the Python tests run).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
which=${1:-all}
build_only=0
[ "${2:-}" = --build-only ] && build_only=1
install_debian_packages

# run_sanitized NAME SANITIZERS [LABEL]: builds the C++ tests (all, or the target LABEL_tests
# that CMakeLists.txt makes of the files labelled LABEL) under the sanitizers and runs them.
run_sanitized() {
  local name=$1 sanitize=$2 label=${3:-}
  local dir=$TOP/build/$name
  log "C++ tests under -fsanitize=$sanitize ${label:+(the ctest label $label)}$([ "$build_only" = 1 ] && echo ": build only")"
  cmake -S "$TOP" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DTENSORXFER_SANITIZE="$sanitize" \
    -DTENSORXFER_BUILD_TESTS=ON -DTENSORXFER_BUILD_PYTHON=OFF -DTENSORXFER_WITH_CUDA=OFF >/dev/null
  cmake --build "$dir" -j2 ${label:+--target "${label}_tests"}
  [ "$build_only" = 1 ] && return 0
  # Two at a time, shm-sweep tests alone: see scripts/test.sh.
  (cd "$dir" && ctest -j2 --output-on-failure --timeout 600 ${label:+-L "^${label}\$"})
}

export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1
# ThreadSanitizer takes the tests labelled `concurrent` (`// ctest-labels: concurrent` in the
# test file): rings, futex waits, streams and events, the copy engine, groups, collectives,
# the pipeline executor.
case $which in
  address) run_sanitized asan "address,undefined" ;;
  thread) run_sanitized tsan thread concurrent ;;
  all)
    run_sanitized asan "address,undefined"
    run_sanitized tsan thread concurrent
    ;;
  *) echo "usage: $0 [address|thread|all]" >&2; exit 2 ;;
esac
