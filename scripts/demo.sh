#!/usr/bin/env bash
# The main job: the replay pipeline demo. Installs what is missing, then runs it.
#   scripts/demo.sh [demo options, e.g. --seconds 10 --collectors 3]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

VENV=${TENSORXFER_VENV:-$TOP/.venv}
install_debian_packages
make_venv "$VENV"
install_package "$VENV" "torch,demo"
log "python -m tensorxfer demo $*"
exec "$VENV/bin/python" -m tensorxfer demo "$@"
