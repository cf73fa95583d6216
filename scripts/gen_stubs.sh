#!/usr/bin/env bash
# Regenerates python/tensorxfer/_core.pyi, the type stub of the extension tensorxfer._core,
# with pybind11-stubgen (the `test` extra), from a built extension.
#   scripts/gen_stubs.sh                      rewrite the checked-in stub from the developer build
#                                             (the _core*.so that the build copied into python/tensorxfer)
#   scripts/gen_stubs.sh --check              regenerate into a temporary directory and fail if the
#                                             checked-in stub differs
#   scripts/gen_stubs.sh --installed [--check] use the tensorxfer that $PYTHON imports (an installed one)
# $PYTHON (default python3) runs pybind11-stubgen. The output is the same for every build of
# the same bindings: build-dependent values (version, what was compiled in) are left out.
set -euo pipefail
TOP=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PYTHON=${PYTHON:-python3}
STUB=$TOP/python/tensorxfer/_core.pyi

check=0 installed=0
for argument in "$@"; do
  case $argument in
    --check) check=1 ;;
    --installed) installed=1 ;;
    *) echo "usage: $0 [--check] [--installed]" >&2; exit 2 ;;
  esac
done

if [ "$installed" = 0 ]; then
  if ! compgen -G "$TOP/python/tensorxfer/_core*.so" >/dev/null; then
    echo "no python/tensorxfer/_core*.so: build the extension first (README, 'Developing tensorxfer')," \
         "or pass --installed to use an installed tensorxfer" >&2
    exit 1
  fi
  export PYTHONPATH=$TOP/python${PYTHONPATH:+:$PYTHONPATH}
fi

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# From a directory without a tensorxfer in it, so the import is exactly the one chosen above.
(cd "$out" && "$PYTHON" -m pybind11_stubgen tensorxfer._core --exit-code -o "$out/stubs" >/dev/null)
generated=$out/stubs/tensorxfer/_core.pyi
# `build_info: dict = {'version': '0.1.0', 'cuda': True, ...}` -> `build_info: dict`
sed -i -E 's/^(__version__|build_info): ([^=]*[^= ]) *=.*$/\1: \2/' "$generated"

if [ "$check" = 1 ]; then
  if ! diff -u "$STUB" "$generated" >&2; then
    echo "python/tensorxfer/_core.pyi does not match the extension's bindings:" \
         "run scripts/gen_stubs.sh (after building) and commit the result" >&2
    exit 1
  fi
  echo "python/tensorxfer/_core.pyi matches the extension" >&2
else
  cp "$generated" "$STUB"
  echo "wrote $STUB" >&2
fi
