#!/usr/bin/env bash
# Every test: GoogleTest (ctest) and pytest against the package installed into a
# fresh virtual environment. Installs what is missing first.
#   scripts/test.sh [extra pytest arguments]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

BUILD=$TOP/build
VENV=$BUILD/test-venv
mkdir -p "$BUILD"
install_debian_packages

log "fresh virtual environment $VENV"
rm -rf "$VENV"
make_venv "$VENV"
install_package "$VENV" "torch,test"

log "C++ tests (GoogleTest via ctest)"
# With the project's own DLPack declaration whatever the system has, as a machine without
# libdlpack-dev builds it; DlpackAbiTest compares it with the system header when there is one.
cmake -S "$TOP" -B "$BUILD/cpp-tests" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DTENSORXFER_BUILD_TESTS=ON -DTENSORXFER_BUILD_BENCH=ON -DTENSORXFER_BUILD_PYTHON=OFF \
  -DTENSORXFER_USE_SYSTEM_DLPACK=OFF >/dev/null
cmake --build "$BUILD/cpp-tests" -j2
# Serially: segment tests leave dead creators' segments on purpose, and a concurrent
# test's ShmSegment::create sweeps such segments away (correctly) under them.
(cd "$BUILD/cpp-tests" && ctest --output-on-failure --timeout 300)

log "Python tests (pytest on the installed package)"
# Run from the checkout with the sources off sys.path: `tensorxfer` must come from the venv.
cd "$TOP"
"$VENV/bin/python" - <<'PY'
import os, sys, tensorxfer
where = os.path.dirname(tensorxfer.__file__)
assert "site-packages" in where, f"tensorxfer imported from {where}, not the installed package"
print(f"testing tensorxfer {tensorxfer.__version__} installed at {where}", file=sys.stderr)
PY

log "type stub and annotations (pybind11-stubgen, mypy)"
PYTHON="$VENV/bin/python" bash "$TOP/scripts/gen_stubs.sh" --installed --check
"$VENV/bin/python" -m mypy examples   # against the installed package: py.typed and _core.pyi
"$VENV/bin/python" -m mypy            # the package sources and the examples ([tool.mypy] in pyproject.toml)
exec "$VENV/bin/python" -m pytest tests/python -p no:cacheprovider "$@"
