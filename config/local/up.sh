#!/usr/bin/env bash
# Install everything and start a local node: containerd with NRI, nri-cni on its embedded default.
# `--runtime crio`: CRI-O instead (unpacked from $NRI_CNI_CRIO_DIR, default ../shared/crio).
# Run as root (no sudo needed). Says what it does as it goes, each step with the seconds since start.
set -euo pipefail
runtime=containerd
case "${1:-}" in
  "") ;;
  --runtime) runtime=${2:-}; [ "$runtime" = containerd ] || [ "$runtime" = crio ] \
               || { echo "usage: up.sh [--runtime containerd|crio]" >&2; exit 2; } ;;
  *) echo "usage: up.sh [--runtime containerd|crio]" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/../.."
# The system's directories first: the system python3 builds the virtualenv, never one a user's
# PATH happens to find first (pyenv, conda).
export PATH=/usr/sbin:/usr/bin:/sbin:/bin:$PATH
start=$(date +%s)
step() { printf 'up: [%3ds] %s\n' "$(( $(date +%s) - start ))" "$*"; }

if [ "$(id -u)" -ne 0 ]; then
  echo "up: run as root (it installs packages, starts containerd and creates network namespaces)" >&2
  exit 1
fi
step "installing runc, iptables, containerd and the CNI plugins (.ci/install-deps; quick once done)"
bash .ci/install-deps
step "creating the virtualenv with the pinned Python packages (.ci/venv)"
VENV=$(bash .ci/venv test)
step "virtualenv ready: $VENV ($("$VENV/bin/python" --version))"
up=(up); [ "$runtime" = containerd ] || up=(up --runtime "$runtime")
step "starting $runtime and nri-cni, waiting until nri-cni is ready (config/local/node.py ${up[*]})"
NRI_CNI_UP_START=$start "$VENV/bin/python" config/local/node.py "${up[@]}"
step "done"
