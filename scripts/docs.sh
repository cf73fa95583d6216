#!/usr/bin/env bash
# The documentation site: Sphinx builds docs/ into build/docs/html, every warning an error
# (-W --keep-going: all of them are listed first), every cross-reference checked (-n).
#   scripts/docs.sh [--installed] [extra sphinx-build arguments]
# A broken cross-reference, a docstring that does not parse, or a name in __all__ of a
# public module that the API reference lacks (docs/_ext/reference_coverage.py) fails it.
#
# It uses the tests' virtual environment (build/test-venv, made as scripts/test.sh makes it:
# the docs tools are in the test extra) and installs this checkout into it incrementally
# first, because the reference is read from the installed package's docstrings.
# --installed skips that install: the environment already holds this checkout (CI runs the
# docs right after scripts/test.sh has installed it). Open build/docs/html/index.html.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

BUILD=$TOP/build
VENV=$BUILD/test-venv
OUT=$BUILD/docs
installed=0
sphinx_args=()
for argument in "$@"; do
  case $argument in
    --installed) installed=1 ;;
    *) sphinx_args+=("$argument") ;;
  esac
done

mkdir -p "$BUILD"
if [ "$installed" = 1 ] && [ -x "$VENV/bin/python" ]; then
  log "using the package installed in $VENV (--installed)"
else
  install_debian_packages
  reuse_or_make_venv "$VENV" "torch,test" 0
fi

log "Sphinx: docs/ -> ${OUT#"$TOP"/}/html (warnings are errors)"
start=$SECONDS
# -E: a fresh environment every time, so every page is read again and every warning shows
# (an incremental build would not repeat the warnings of pages it did not reread).
"$VENV/bin/python" -m sphinx -b html -E -W --keep-going -n -q -d "$OUT/doctrees" "$TOP/docs" "$OUT/html" \
  ${sphinx_args[@]+"${sphinx_args[@]}"}
log "docs built in $((SECONDS - start)) s: ${OUT#"$TOP"/}/html/index.html"
