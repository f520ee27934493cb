#!/usr/bin/env bash
# podman with nri-cni's own image store: rootful, no registry, nothing shared with the system's
# podman (its own storage, config, events log). config/image/build.sh builds into it and
# tests/e2e/test_image.py runs from it.
#   usage: config/image/podman.sh PODMAN-ARGS...
#   NRI_CNI_IMAGE_STORE  the store (default /var/tmp/nri-cni-image; kept between runs as a cache;
#                        podman's run state goes to /run/nri-cni-image-HASH, HASH of the store)
#   NRI_CNI_IMAGE_DRIVER overlay (default) or vfs, for a filesystem overlay cannot sit on
set -euo pipefail
STORE=${NRI_CNI_IMAGE_STORE:-/var/tmp/nri-cni-image}
DRIVER=${NRI_CNI_IMAGE_DRIVER:-overlay}
RUNROOT=/run/nri-cni-image-$(printf %s "$STORE" | sha256sum | cut -c1-12)
mkdir -p "$STORE/etc" "$STORE/storage" "$STORE/net.d" "$RUNROOT"
# Written on every call (cheap) so that a change here applies to an existing store.
cat > "$STORE/etc/storage.conf.new" <<CONF
[storage]
driver = "$DRIVER"
graphroot = "$STORE/storage"
runroot = "$RUNROOT/storage"
CONF
# Containers get this process's open-file limit and as many processes as there can be PIDs:
# podman's defaults (the kernel's maxima) cannot be set where CAP_SYS_RESOURCE is not in the
# bounding set (a sandbox), and conmon runs with nproc lowered to pid_max.
nproc=$(ulimit -Hu); pid_max=$(cat /proc/sys/kernel/pid_max)
{ [ "$nproc" = unlimited ] || [ "$nproc" -gt "$pid_max" ]; } && nproc=$pid_max
cat > "$STORE/etc/containers.conf.new" <<CONF
[containers]
default_ulimits = ["nofile=$(ulimit -Hn):$(ulimit -Hn)", "nproc=$nproc:$nproc"]
[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = "$STORE/events.log"
tmp_dir = "$RUNROOT/libpod"
[network]
network_backend = "cni"
network_config_dir = "$STORE/net.d"
CONF
# No registry is searched for a short name: FROM and run name local images only.
printf 'unqualified-search-registries = []\n' > "$STORE/etc/registries.conf.new"
for f in storage containers registries; do
  mv "$STORE/etc/$f.conf.new" "$STORE/etc/$f.conf"
done
export CONTAINERS_STORAGE_CONF=$STORE/etc/storage.conf
export CONTAINERS_CONF=$STORE/etc/containers.conf
export CONTAINERS_REGISTRIES_CONF=$STORE/etc/registries.conf
exec podman "$@"
