# Shared set-up steps for scripts/demo.sh and scripts/test.sh (sourced, not run).
# Installs only what is missing: Debian packages, a virtual environment, the package.

TOP=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# libdlpack-dev is optional for the package (it declares the DLPack ABI itself); the tests
# use it: DlpackAbiTest compares the two DLPack declarations. NUMA needs no package: the
# core makes the kernel's NUMA system calls itself.
# ccache: every build of these scripts goes through it (see use_compiler_cache).
DEBIAN_PACKAGES=(cmake ninja-build g++ python3-dev python3-venv libdlpack-dev
                 libgtest-dev libbenchmark-dev ccache)
TORCH_VERSION=2.13.0

log() { printf '\033[1m==> [%4d s] %s\033[0m\n' "$SECONDS" "$*" >&2; }

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi
}

# Debian packages that are missing (headers, test and benchmark libraries, build tools).
install_debian_packages() {
  local missing=()
  for package in "${DEBIAN_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" \
      || missing+=("$package")
  done
  # A Python from elsewhere (pyenv, conda) brings its own headers and venv.
  if python3 -c 'import sys, sysconfig, os; sys.exit(0 if os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")) else 1)' 2>/dev/null \
     && python3 -c 'import ensurepip, venv' 2>/dev/null; then
    missing=("${missing[@]/python3-dev}"); missing=("${missing[@]/python3-venv}")
  fi
  # Build tools already on PATH (e.g. from pip) need no Debian copy.
  command -v cmake >/dev/null && missing=("${missing[@]/cmake}")
  command -v ninja >/dev/null && missing=("${missing[@]/ninja-build}")
  command -v g++ >/dev/null && missing=("${missing[@]/g++}")
  local wanted=()
  for package in "${missing[@]}"; do [ -n "$package" ] && wanted+=("$package"); done
  if [ ${#wanted[@]} -gt 0 ]; then
    log "installing Debian packages: ${wanted[*]}"
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${wanted[@]}" >/dev/null
  fi
  use_compiler_cache
}

# Every CMake build started from here, pip's included (CMake takes the launcher from the
# environment), compiles through ccache when it is installed. Paths under the checkout are
# hashed relative to it and the working directory not at all, so a clone in another folder
# (CI's) reuses what this one compiled.
use_compiler_cache() {
  if command -v ccache >/dev/null; then
    export CMAKE_CXX_COMPILER_LAUNCHER=ccache CCACHE_BASEDIR=$TOP CCACHE_NOHASHDIR=1
  fi
}

# background_at_lowest_priority LOG COMMAND...: starts COMMAND in a session of its own (so that
# `kill -- -PID` takes down everything it started), at the lowest CPU priority, with output
# to LOG; sets BACKGROUND_PID. With the kernel's autogroups (sched_autogroup_enabled), nice
# only orders processes within one session, so the new session's group is made nice 19 too:
# otherwise it would get half of the CPUs whatever its processes' nice values.
background_at_lowest_priority() {
  local log=$1
  shift
  setsid bash -c 'echo 19 > /proc/self/autogroup 2>/dev/null || true; exec nice -n 19 "$@"' bash "$@" > "$log" 2>&1 &
  BACKGROUND_PID=$!
}

# make_venv DIR: a virtual environment with pip up to date and torch $TORCH_VERSION (CPU).
make_venv() {
  local venv=$1
  if [ ! -x "$venv/bin/python" ]; then
    log "creating virtual environment $venv"
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install -q --upgrade pip
  fi
  if ! "$venv/bin/python" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$TORCH_VERSION')" 2>/dev/null; then
    log "installing torch==$TORCH_VERSION into $venv"
    "$venv/bin/python" -m pip install -q "torch==$TORCH_VERSION"
  fi
}

# install_package VENV EXTRAS: `pip install .[EXTRAS]` from this checkout, build isolation on,
# exactly as a user runs it.
install_package() {
  local venv=$1 extras=$2
  log "pip install .[$extras] (builds the C++ core and the extension)"
  (cd "$TOP" && "$venv/bin/python" -m pip install -q ".[$extras]")
}

# dependency_digest EXTRAS: a digest of what a virtual environment for EXTRAS is made of --
# the Python version, torch's version, pyproject.toml's build requirements, dependencies
# and optional dependencies (not the rest of the file: a linter setting changes nothing).
dependency_digest() {
  python3 - "$TOP/pyproject.toml" "$1" "$TORCH_VERSION" <<'PY'
import hashlib, json, sys
path, extras, torch_version = sys.argv[1:]
try:
    import tomllib
    with open(path, "rb") as file:
        project = tomllib.load(file)
    spec = [project["build-system"], project["project"].get("dependencies"),
            project["project"].get("optional-dependencies")]
except ImportError:  # Python < 3.11: the whole file stands for the spec
    spec = open(path).read()
text = json.dumps([sys.version_info[:2], extras, torch_version, spec], sort_keys=True)
print(hashlib.sha256(text.encode()).hexdigest())
PY
}

# reuse_or_make_venv VENV EXTRAS FRESH: keeps VENV while dependency_digest is unchanged and
# FRESH is 0; otherwise deletes it and installs torch, EXTRAS and the build requirements anew.
# Then installs this checkout into it: in a new environment as a user does (`pip install
# .[EXTRAS]`, build isolation on); in a kept one without build isolation or dependency
# resolution, so the build directory (build/<wheel tag>) is reused and only what changed
# is recompiled.
reuse_or_make_venv() {
  local venv=$1 extras=$2 fresh=$3
  local stamp=$venv/.tensorxfer-dependencies digest
  digest=$(dependency_digest "$extras")
  if [ "$fresh" = 1 ] || [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$digest" ] || [ ! -x "$venv/bin/python" ]; then
    log "new virtual environment $venv ($([ "$fresh" = 1 ] && echo "--fresh" || echo "the dependency spec changed or there was none"))"
    rm -rf "$venv"
    make_venv "$venv"
    install_package "$venv" "$extras"
    # The build requirements, for the incremental installs of later runs.
    "$venv/bin/python" - "$TOP/pyproject.toml" <<'PY' | xargs -d '\n' "$venv/bin/python" -m pip install -q
import re, sys
text = open(sys.argv[1]).read()
requires = re.search(r'^requires = \[(.*?)\]', text, re.M | re.S).group(1)
print("\n".join(re.findall(r'"([^"]+)"', requires)))
PY
    echo "$digest" > "$stamp"
  else
    log "keeping virtual environment $venv (dependencies unchanged); incremental install of the package"
    (cd "$TOP" && "$venv/bin/python" -m pip install -q --no-deps --no-build-isolation .)
  fi
}
