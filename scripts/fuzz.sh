#!/usr/bin/env bash
# The fuzz targets of tests/fuzz (libFuzzer, clang 14, ASan+UBSan): builds them, replays each
# target's committed regression inputs, then fuzzes each target for N seconds (one target per
# CPU at a time) and prints its executions and coverage. Exits non-zero on any finding (the input is kept under
# build/fuzz/findings/<target>/; tests/fuzz/README.md says how to turn it into a regression).
#   scripts/fuzz.sh [--seconds N] [--target NAME]... [--build-only]
# --seconds    fuzzing time per target (default 10); 0 replays the committed inputs only
# --target     only this target (repeatable; default every tests/fuzz/*_fuzz.cc)
# --build-only build and stop (CI builds while other stages run)
# Findings are: a crash or sanitizer report, an exception that is not a tensorxfer::Error or a
# broken contract (the target aborts), one input running past 1 s (-timeout=1), the process past
# 2048 MiB (-rss_limit_mb) or one allocation past 1024 MiB (-malloc_limit_mb).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

seconds=10 build_only=0
targets=()
while [ $# -gt 0 ]; do
  case $1 in
    --seconds) seconds=$2; shift 2 ;;
    --seconds=*) seconds=${1#--seconds=}; shift ;;
    --target) targets+=("$2"); shift 2 ;;
    --target=*) targets+=("${1#--target=}"); shift ;;
    --build-only) build_only=1; shift ;;
    *) echo "usage: $0 [--seconds N] [--target NAME]... [--build-only]" >&2; exit 2 ;;
  esac
done
case $seconds in ''|*[!0-9]*) echo "$0: --seconds takes a whole number, got '$seconds'" >&2; exit 2 ;; esac

DEBIAN_PACKAGES+=(clang-14 libclang-rt-14-dev)
install_debian_packages
FUZZ_BUILD=$TOP/build/fuzz
log "fuzz targets: building in $FUZZ_BUILD (clang++-14, -fsanitize=fuzzer,address,undefined)"
cmake -S "$TOP" -B "$FUZZ_BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_COMPILER=clang++-14 -DTENSORXFER_SANITIZE=address,undefined \
  -DTENSORXFER_BUILD_FUZZ=ON -DTENSORXFER_BUILD_TESTS=OFF -DTENSORXFER_BUILD_PYTHON=OFF \
  -DTENSORXFER_WITH_CUDA=OFF >/dev/null
if [ ${#targets[@]} -eq 0 ]; then
  for source in "$TOP"/tests/fuzz/*_fuzz.cc; do targets+=("$(basename "$source" .cc)"); done
fi
cmake --build "$FUZZ_BUILD" -j2 --target "${targets[@]}"
[ "$build_only" = 1 ] && exit 0

# halt_on_error: a UBSan report is a finding like an ASan one (libFuzzer then keeps the input).
export ASAN_OPTIONS=abort_on_error=1:detect_leaks=1:strict_string_checks=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
limits=(-timeout=1 -rss_limit_mb=2048 -malloc_limit_mb=1024)

# One target's run: its table row goes to $FUZZ_BUILD/$target.row; exit status 1 on a finding.
fuzz_one() {
  local target=$1
  local binary=$FUZZ_BUILD/$target
  local seeds=$TOP/tests/fuzz/corpus/$target
  local regressions=$TOP/tests/fuzz/regressions/$target
  local work=$FUZZ_BUILD/corpus/$target
  local findings=$FUZZ_BUILD/findings/$target
  local logfile=$FUZZ_BUILD/$target.log
  local row=$FUZZ_BUILD/$target.row
  mkdir -p "$work" "$findings"
  # The committed inputs (regressions, seeds) must pass: a fixed finding stays fixed. With
  # --seconds 0 they are replayed one by one; otherwise libFuzzer runs each of them first, as
  # part of its corpus, under the same limits (a failure there is a finding like any other).
  if [ "$seconds" = 0 ]; then
    local replay=() dir file
    for dir in "$regressions" "$seeds"; do
      [ -d "$dir" ] && while IFS= read -r -d '' file; do replay+=("$file"); done < <(find "$dir" -type f -print0)
    done
    if [ ${#replay[@]} -gt 0 ] && ! "$binary" "${limits[@]}" "${replay[@]}" > "$logfile.replay" 2>&1; then
      tail -n 30 "$logfile.replay" >&2
      log "$target: a committed input fails (log: $logfile.replay)"
      printf '%-22s %12s %8s  %s\n' "$target" "-" "-" "a committed input fails" > "$row"
      return 1
    fi
    printf '%-22s %12s %8s  %s\n' "$target" "${#replay[@]}" "-" "replayed" > "$row"
    return 0
  fi
  log "$target: fuzzing for $seconds s"
  local status=0 executions edges
  # New inputs go to the first directory (the working corpus, kept between runs); the seeds and
  # the regressions are read.
  local corpora=("$work")
  for dir in "$seeds" "$regressions"; do [ -d "$dir" ] && corpora+=("$dir"); done
  (cd "$findings" && "$binary" "${limits[@]}" -max_total_time="$seconds" -print_final_stats=1 \
     -artifact_prefix="$findings/" "${corpora[@]}") > "$logfile" 2>&1 || status=$?
  executions=$(sed -n 's/^stat::number_of_executed_units: *//p' "$logfile" | tail -n 1)
  edges=$(grep -oE '(DONE|pulse|NEW|REDUCE|INITED) +cov: [0-9]+' "$logfile" | tail -n 1 | grep -oE '[0-9]+$' || true)
  if [ "$status" != 0 ]; then
    grep -E 'FUZZ FINDING|ERROR: |runtime error|SUMMARY|Test unit written' "$logfile" | head -n 8 >&2 || true
    log "$target: FINDING (exit $status; log: $logfile; input under $findings/)"
    printf '%-22s %12s %8s  %s\n' "$target" "${executions:-?}" "${edges:-?}" "FINDING: see $logfile" > "$row"
    return 1
  fi
  printf '%-22s %12s %8s  %s\n' "$target" "${executions:-?}" "${edges:-?}" "ok" > "$row"
}

# One target per CPU at a time: each libFuzzer run is one process on one core.
parallel=$(nproc)
running=0
for target in "${targets[@]}"; do
  if [ "$running" -ge "$parallel" ]; then
    wait -n || true
    running=$((running - 1))
  fi
  rm -f "$FUZZ_BUILD/$target.row"
  fuzz_one "$target" &
  running=$((running + 1))
done
wait
failed=()
rows=()
for target in "${targets[@]}"; do
  row_file=$FUZZ_BUILD/$target.row
  if [ -f "$row_file" ]; then rows+=("$(cat "$row_file")"); else rows+=("$target: no result (the run died)"); fi
  grep -qE 'FINDING|fails|no result' <<<"${rows[-1]}" && failed+=("$target")
done

printf '\n==> fuzz targets (%s s each; edges: libFuzzer cov, the instrumented edges reached)\n' "$seconds"
printf '    %-22s %12s %8s  %s\n' target executions edges result
printf '    %s\n' "${rows[@]}"
if [ ${#failed[@]} -gt 0 ]; then
  log "findings in: ${failed[*]}"
  exit 1
fi
