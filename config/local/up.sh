#!/usr/bin/env bash
# Install everything and start a local node: containerd with NRI, nri-cni on its embedded default.
set -euo pipefail
cd "$(dirname "$0")/../.."
bash .ci/install-deps
python3 -m pip install -q --disable-pip-version-check -e '.[test]'
python3 config/local/node.py up
