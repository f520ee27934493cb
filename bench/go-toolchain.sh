#!/usr/bin/env bash
# Builds bench/libcni-driver (the libcni anchor) at bench time from Debian's packages:
#   golang-github-appc-cni-dev (libcni's source), golang-1.XX-go and golang-1.XX-src (Debian's Go),
# fetched with a throw-away apt configuration (the suite is ours, the archive the one this
# machine's apt already uses) and unpacked with dpkg-deb -x into $PREFIX: the system's package
# database is not touched. GOPATH mode over /usr/share/gocode, so no module is downloaded.
# Prints the driver's path last; exits non-zero (with the reason on stderr) when Go cannot be had.
#   usage: bench/go-toolchain.sh [OUT]     (built when absent; default: $PREFIX/libcni-driver-<hash
#   of its source>)
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
DEPS=${NRI_CNI_DEPS:-/opt/nri-cni-deps}
PREFIX=${NRI_CNI_BENCH_GO:-$DEPS/bench-go}
# named after its source: worktrees with different drivers share $PREFIX without overwriting
SRC_ID=$(cat "$HERE"/libcni-driver/*.go | sha256sum | cut -c1-12)
OUT=${1:-$PREFIX/libcni-driver-$SRC_ID}
SUITE=${NRI_CNI_BENCH_GO_SUITE:-sid}   # bookworm's Go (1.19) is older than libcni 1.3.0 wants
APTDIR=$PREFIX/apt
ROOT=$PREFIX/root
log() { echo "go-toolchain: $*" >&2; }

goroot() { ls -d "$ROOT"/usr/lib/go-1.* 2>/dev/null | sort -V | tail -1; }
LIBCNI=$ROOT/usr/share/gocode/src/github.com/containernetworking/cni/libcni

if [ -z "$(goroot)" ] || [ ! -d "$LIBCNI" ]; then
  mkdir -p "$APTDIR"/{lists/partial,archives/partial,debs}
  uri=$(bash "$HERE/../.ci/apt-archive-uri")
  echo "deb $uri $SUITE main" > "$APTDIR/sources.list"
  APT=(-o Dir::Etc::SourceList="$APTDIR/sources.list" -o Dir::Etc::SourceParts=/dev/null
       -o Dir::State::Lists="$APTDIR/lists" -o Dir::Cache="$APTDIR"
       -o Dir::State::Status=/dev/null -o APT::Get::List-Cleanup=0 -o Debug::NoLocking=1)
  apt-get "${APT[@]}" update -qq
  # golang-go depends on golang-1.XX-go: that names the suite's Go
  gover=$(apt-cache "${APT[@]}" depends golang-go 2>/dev/null | awk '/Depends: golang-1\.[0-9]+-go/ {print $2; exit}')
  if [ -z "$gover" ]; then
    log "no golang-1.XX-go in $SUITE"; exit 3
  fi
  src=${gover%-go}-src
  log "fetching $gover $src golang-github-appc-cni-dev ($SUITE)"
  ( cd "$APTDIR/debs" && rm -f ./*.deb &&
    apt-get "${APT[@]}" download "$gover" "$src" golang-github-appc-cni-dev >/dev/null 2>&1 ) \
    || { log "apt-get download failed"; exit 3; }
  rm -rf "$ROOT"; mkdir -p "$ROOT"
  for deb in "$APTDIR"/debs/*.deb; do dpkg-deb -x "$deb" "$ROOT"; done
  for deb in "$APTDIR"/debs/*.deb; do dpkg-deb -W --showformat='${Package} ${Version}\n' "$deb"; done \
    > "$PREFIX/versions.txt"
  rm -f "$APTDIR"/debs/*.deb
fi
GOROOT=$(goroot)
[ -x "$GOROOT/bin/go" ] || { log "no go binary under $ROOT"; exit 3; }

# GOPATH layout: Debian's gocode tree plus the driver, both read-only for the build.
GOPATH=$PREFIX/gopath
SRC=$GOPATH/src/nri-cni-bench/libcni-driver-$SRC_ID
mkdir -p "$GOPATH/src/nri-cni-bench"
ln -sfn "$ROOT/usr/share/gocode/src/github.com" "$GOPATH/src/github.com"
if [ ! -x "$OUT" ]; then
  rm -rf "$SRC"
  cp -r "$HERE/libcni-driver" "$SRC"
  log "building with $("$GOROOT/bin/go" version 2>/dev/null | awk '{print $3}')"
  ( cd "$SRC" &&
    env -u GOFLAGS GOROOT="$GOROOT" GOPATH="$GOPATH" GO111MODULE=off GOPROXY=off GOTOOLCHAIN=local \
      GOCACHE="$PREFIX/gocache" CGO_ENABLED=0 "$GOROOT/bin/go" build -o "$OUT.tmp$$" . )
  mv -f "$OUT.tmp$$" "$OUT"  # whole, or not at all, for a build beside it
fi
echo "$OUT"
