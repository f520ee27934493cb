#!/usr/bin/env bash
# Install everything and start a local node: containerd with NRI, nri-cni on its embedded default.
set -euo pipefail
cd "$(dirname "$0")/../.."
export PATH=/usr/sbin:/usr/bin:/sbin:/bin:$PATH
bash .ci/install-deps
VENV=$(bash .ci/venv test)
"$VENV/bin/python" config/local/node.py up
