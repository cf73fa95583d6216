#!/usr/bin/env bash
# The C++ tests under AddressSanitizer + UndefinedBehaviorSanitizer (all of them) and
# ThreadSanitizer (the concurrent parts: rings, futex waits, streams/events, copy engine).
#   scripts/sanitize.sh [address|thread|all]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
which=${1:-all}
install_debian_packages

run_sanitized() {
  local name=$1 sanitize=$2 filter=$3
  local dir=$TOP/build/$name
  log "C++ tests under -fsanitize=$sanitize ${filter:+(tests matching $filter)}"
  cmake -S "$TOP" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DTENSORXFER_SANITIZE="$sanitize" \
    -DTENSORXFER_BUILD_TESTS=ON -DTENSORXFER_BUILD_PYTHON=OFF -DTENSORXFER_WITH_CUDA=OFF >/dev/null
  cmake --build "$dir" -j2
  # Serially: see scripts/test.sh.
  (cd "$dir" && ctest --output-on-failure --timeout 600 ${filter:+-R "$filter"})
}

export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1
case $which in
  address) run_sanitized asan "address,undefined" "" ;;
  thread) run_sanitized tsan thread "ProcessId|SlotRing|Futex|EventCount|SpinPolicy|HostStream|HostEvent|CopyEngine|Pack|LocalGroup|IpcMemory|Communicator|AllReduce|PipelineExecutor|LivenessLock" ;;
  all)
    run_sanitized asan "address,undefined" ""
    run_sanitized tsan thread "ProcessId|SlotRing|Futex|EventCount|SpinPolicy|HostStream|HostEvent|CopyEngine|Pack|LocalGroup|IpcMemory|Communicator|AllReduce|PipelineExecutor|LivenessLock"
    ;;
  *) echo "usage: $0 [address|thread|all]" >&2; exit 2 ;;
esac
