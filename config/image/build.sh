#!/usr/bin/env bash
# Builds the DaemonSet's image from the repository's Containerfile with no registry at all:
#   1. a bookworm root filesystem from the Debian archive this machine's apt already uses
#      (mmdebstrap, minbase, docs and man pages left out as in debian:*-slim), imported as the
#      local base image localhost/nri-cni-base:bookworm-KEY (podman import);
#   2. a wheelhouse of nri-cni's pinned Python dependencies (requirements/constraints.txt),
#      downloaded here by pip with this machine's index settings; the build's pip installs
#      from it only (--no-index);
#   3. podman build -f Containerfile --build-arg BASE=<that base>; the RUN steps' apt-get reaches
#      the same archive (the base's sources.list), so the build has the host's network;
#   4. prints the image's size and what is in it (nri-cni, Python, the shim, the plugins).
# The store (config/image/podman.sh, default /var/tmp/nri-cni-image) is a cache: the base is
# rebuilt when the mmdebstrap command changes or it is older than NRI_CNI_BASE_DAYS (7) days,
# the wheelhouse when the pins change, and podman's layer cache keeps every step whose
# Containerfile line and inputs are unchanged.
#   usage: config/image/build.sh [TAG]      (default localhost/nri-cni:VERSION; printed last)
set -euo pipefail
cd "$(dirname "$0")/../.."
export NRI_CNI_IMAGE_STORE=${NRI_CNI_IMAGE_STORE:-/var/tmp/nri-cni-image}
STORE=$NRI_CNI_IMAGE_STORE
SUITE=bookworm
VERSION=$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml)
TAG=${1:-localhost/nri-cni:$VERSION}
podman() { bash config/image/podman.sh "$@"; }
log() { echo "image: $*" >&2; }
t0=$(date +%s)

for tool in podman mmdebstrap; do
  command -v "$tool" >/dev/null || { echo "image: $tool missing (bash .ci/install-deps)" >&2; exit 1; }
done
mkdir -p "$STORE"
exec 9>"$STORE/build.lock"
flock 9  # one build per store at a time (several checkouts on one machine)

# -- 1. the base --------------------------------------------------------------------------------
uri=$(bash .ci/apt-archive-uri)
debstrap=(mmdebstrap --variant=minbase --mode=root --format=tar
  --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*'
  --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/doc/*'
  --dpkgopt='path-include=/usr/share/doc/*/copyright'
  --aptopt='APT::Install-Recommends "false"'
  # as in debian:*-slim: no downloaded package or package cache stays in an image layer
  --customize-hook='printf "%s;\n" "APT::Keep-Downloaded-Packages \"false\"" \
     "Dir::Cache::pkgcache \"\"" "Dir::Cache::srcpkgcache \"\"" > "$1/etc/apt/apt.conf.d/90slim"
     rm -f "$1"/var/cache/apt/*.bin')
sources=("deb $uri $SUITE main" "deb $uri $SUITE-updates main")
key=$(printf '%s\n' "${debstrap[@]}" "$SUITE" "${sources[@]}" | sha256sum | cut -c1-12)
BASE=localhost/nri-cni-base:$SUITE-$key
max_age=$(( ${NRI_CNI_BASE_DAYS:-7} * 86400 ))
created=$(podman image inspect --format '{{.Created.Unix}}' "$BASE" 2>/dev/null || echo 0)
if [ $(( $(date +%s) - created )) -gt "$max_age" ]; then
  log "making the base $BASE: ${debstrap[*]} $SUITE $STORE/base.tar ${sources[*]}"
  trap 'rm -f "$STORE/base.tar"' EXIT
  "${debstrap[@]}" "$SUITE" "$STORE/base.tar" "${sources[@]}" >&2
  podman import --quiet "$STORE/base.tar" "$BASE" >/dev/null
  rm -f "$STORE/base.tar"
  # older bases lose their name: they and the layers built on them are pruned below
  for old_base in $(podman images --format '{{.Repository}}:{{.Tag}}' localhost/nri-cni-base); do
    [ "$old_base" = "$BASE" ] || podman untag "$old_base"
  done
else
  log "base $BASE (cached)"
fi

# -- 2. the wheelhouse --------------------------------------------------------------------------
PY=/usr/bin/python3
pyver=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
wkey=$( { echo "$pyver"; cat requirements/constraints.txt; sed -n '/^\[build-system\]/,/^\[project.optional/p' pyproject.toml; } \
  | sha256sum | cut -c1-12)
WHEELS=$STORE/wheels/$wkey
if [ ! -f "$WHEELS/.complete" ]; then
  log "downloading the wheelhouse $WHEELS (Python $pyver)"
  [ -x "$STORE/pip/bin/pip" ] || "$PY" -m venv "$STORE/pip"
  rm -rf "$WHEELS" "$WHEELS.tmp"
  # nri-cni's dependencies as pinned, and its build backend (pip builds nri-cni in isolation)
  build_reqs=$(sed -n 's/^requires = \[\(.*\)\]$/\1/p' pyproject.toml | tr -d '",')
  "$STORE/pip/bin/pip" download -q --disable-pip-version-check --only-binary=:all: -d "$WHEELS.tmp" \
    -c requirements/constraints.txt . $build_reqs >&2
  rm -f "$WHEELS.tmp"/nri_cni-* "$WHEELS.tmp"/nri-cni-*
  touch "$WHEELS.tmp/.complete"
  mv "$WHEELS.tmp" "$WHEELS"
  find "$STORE/wheels" -mindepth 1 -maxdepth 1 ! -name "$wkey" -exec rm -rf {} +
else
  log "wheelhouse $WHEELS (cached)"
fi

# -- 3. the image -------------------------------------------------------------------------------
log "building $TAG from Containerfile (base $BASE)"
build=(podman build --layers --network=host -f Containerfile --cni-config-dir "$STORE/net.d"
  --build-arg BASE="$BASE" --build-arg PIP_OPTIONS="--no-index --find-links /wheels"
  --volume "$WHEELS:/wheels:ro")
tb=$(date +%s)
"${build[@]}" -t "$TAG" . >&2
log "built in $(( $(date +%s) - tb ))s"
# The build stage keeps a name (all its steps come from the cache just filled), so that pruning
# the images nothing names any more (earlier builds, older bases) keeps its layers as a cache.
"${build[@]}" --quiet --target build -t localhost/nri-cni-build:cache . >/dev/null
podman image prune --force >/dev/null

# -- 4. what it is ------------------------------------------------------------------------------
size=$(podman image inspect --format '{{.Size}}' "$TAG")
log "$TAG: $(( size / 1024 / 1024 )) MiB ($size bytes), base $BASE"
podman run --rm -i --network=none "$TAG" python3 - < config/image/describe.py >&2
log "done in $(( $(date +%s) - t0 ))s"
echo "$TAG"
