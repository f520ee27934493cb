"""The DaemonSet of config/kubernetes/*.yaml as `podman run` flags: what a kubelet would give
its containers on one node, and nothing else.

Every field of the pod spec and of each container is either turned into a flag or named here
as one that gives none (scheduling, probes, requests the runtime does not see); a field this
module does not know is an error, so the manifest cannot grow something the container test
silently leaves out. A test may move the node's host paths (``host_paths``: a private
containerd's dirs) and gives each ConfigMap volume a directory and each ``fieldRef`` a value,
the way the kubelet fills them in.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

POD_FIELDS_WITH_FLAGS = {
    "hostNetwork",
    "hostPID",
    "terminationGracePeriodSeconds",
    "initContainers",
    "containers",
    "volumes",
}
# what the kubelet or the scheduler uses and the container runtime never sees
POD_FIELDS_WITHOUT_FLAGS = {"automountServiceAccountToken", "priorityClassName", "tolerations"}
CONTAINER_FIELDS_WITH_FLAGS = {"command", "args", "env", "securityContext", "resources", "volumeMounts"}
CONTAINER_FIELDS_WITHOUT_FLAGS = {"name", "image", "readinessProbe", "livenessProbe"}
# HostToContainer: mounts made on the host later show up inside (rslave); the default: none
PROPAGATION = {None: "rprivate", "None": "rprivate", "HostToContainer": "rslave", "Bidirectional": "rshared"}
_QUANTITY = re.compile(r"^(\d+)(Ki|Mi|Gi|k|M|G)?$")
_UNITS = {None: 1, "k": 10**3, "M": 10**6, "G": 10**9, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30}


class ManifestError(ValueError):
    """The manifest has something this translation does not know how to give a container."""


@dataclass(frozen=True)
class Mount:
    host: str
    container: str
    readonly: bool
    propagation: str
    host_type: str  # the hostPath's type ("DirectoryOrCreate", ...); "configMap" for those


@dataclass(frozen=True)
class ContainerRun:
    name: str
    image: str  # the manifest's image name (the test runs its own build instead)
    command: tuple[str, ...]
    args: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    mounts: tuple[Mount, ...]
    host_network: bool
    host_pid: bool
    privileged: bool
    cap_add: tuple[str, ...] = ()
    cap_drop: tuple[str, ...] = ()
    memory_limit: int | None = None
    cpu_shares: int | None = None
    stop_timeout: int | None = None
    readiness: tuple[str, ...] | None = None
    liveness: tuple[str, ...] | None = None

    def podman_flags(self) -> list[str]:
        """`podman run` flags for this container (before the image name)."""
        flags: list[str] = []
        if self.host_network:
            flags.append("--network=host")
        if self.host_pid:
            flags.append("--pid=host")
        if self.privileged:
            flags.append("--privileged")
        flags += [f"--cap-add={c}" for c in self.cap_add]
        flags += [f"--cap-drop={c}" for c in self.cap_drop]
        for m in self.mounts:
            opts = ["ro" if m.readonly else "rw", m.propagation]
            flags.append(f"--volume={m.host}:{m.container}:{','.join(opts)}")
        flags += [f"--env={k}={v}" for k, v in self.env]
        if self.memory_limit is not None:
            flags.append(f"--memory={self.memory_limit}")
        if self.cpu_shares is not None:
            flags.append(f"--cpu-shares={self.cpu_shares}")
        if self.stop_timeout is not None:
            flags.append(f"--stop-timeout={self.stop_timeout}")
        # Kubernetes' command replaces the image's ENTRYPOINT (and its CMD); args follow the image
        if self.command:
            flags.append(f"--entrypoint={json.dumps(list(self.command))}")
        return flags


def load(paths: list[Path]) -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for path in sorted(paths):
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def only(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [d for d in docs if d.get("kind") == kind]
    if len(found) != 1:
        raise ManifestError(f"expected one {kind}, found {len(found)}")
    return found[0]


def quantity(value: str | int) -> int:
    m = _QUANTITY.match(str(value))
    if not m:
        raise ManifestError(f"quantity {value!r}: not a plain number with a binary or decimal suffix")
    return int(m.group(1)) * _UNITS[m.group(2)]


def milli_cpu(value: str | int) -> int:
    text = str(value)
    return int(text[:-1]) if text.endswith("m") else int(float(text) * 1000)


def _check_fields(where: str, obj: Mapping[str, Any], known: set[str]) -> None:
    unknown = set(obj) - known
    if unknown:
        raise ManifestError(f"{where}: no run flag known for {sorted(unknown)} (tests/support/daemonset.py)")


def _exec_probe(probe: Mapping[str, Any] | None) -> tuple[str, ...] | None:
    if probe is None:
        return None
    if "exec" not in probe:
        raise ManifestError(f"probe {probe}: only exec probes are run by the container test")
    return tuple(probe["exec"]["command"])


def _env(container: Mapping[str, Any], field_values: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    out: list[tuple[str, str]] = []
    for item in container.get("env", []):
        if "value" in item:
            out.append((item["name"], str(item["value"])))
            continue
        ref = item.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
        if ref is None or ref not in field_values:
            raise ManifestError(f"env {item['name']}: {item.get('valueFrom')} has no value in this run")
        out.append((item["name"], field_values[ref]))
    return tuple(out)


def _resources(container: Mapping[str, Any]) -> tuple[int | None, int | None]:
    res = container.get("resources", {})
    _check_fields("resources", res, {"requests", "limits"})
    limits, requests = res.get("limits", {}), res.get("requests", {})
    _check_fields("resources.limits", limits, {"memory", "cpu"})
    _check_fields("resources.requests", requests, {"memory", "cpu"})
    if "cpu" in limits:
        raise ManifestError("resources.limits.cpu: --cpus is not derived here")
    memory = quantity(limits["memory"]) if "memory" in limits else None
    # the kubelet's CPU shares for a request (memory requests set nothing in the runtime)
    shares = max(2, milli_cpu(requests["cpu"]) * 1024 // 1000) if "cpu" in requests else None
    return memory, shares


def _security(container: Mapping[str, Any]) -> tuple[bool, tuple[str, ...], tuple[str, ...]]:
    sec = container.get("securityContext", {})
    _check_fields("securityContext", sec, {"privileged", "capabilities"})
    caps = sec.get("capabilities", {})
    _check_fields("securityContext.capabilities", caps, {"add", "drop"})
    return bool(sec.get("privileged", False)), tuple(caps.get("add", ())), tuple(caps.get("drop", ()))


def container_runs(
    daemonset: Mapping[str, Any],
    *,
    host_paths: Mapping[str, str | Path] | None = None,
    config_maps: Mapping[str, str | Path] | None = None,
    field_values: Mapping[str, str] | None = None,
) -> tuple[list[ContainerRun], list[ContainerRun]]:
    """The init containers and the containers of the DaemonSet's pod, in order.

    ``host_paths``: hostPath path -> the directory or file used instead (others stay as they are);
    ``config_maps``: ConfigMap name -> a directory holding its data as files;
    ``field_values``: a fieldRef's fieldPath -> its value (``spec.nodeName``)."""
    host_paths = {k: str(v) for k, v in (host_paths or {}).items()}
    config_maps = {k: str(v) for k, v in (config_maps or {}).items()}
    field_values = dict(field_values or {})
    spec = daemonset["spec"]["template"]["spec"]
    _check_fields("pod spec", spec, POD_FIELDS_WITH_FLAGS | POD_FIELDS_WITHOUT_FLAGS)
    volumes: dict[str, tuple[str, str]] = {}
    for vol in spec.get("volumes", []):
        if "hostPath" in vol:
            path = vol["hostPath"]["path"]
            volumes[vol["name"]] = (host_paths.get(path, path), vol["hostPath"].get("type", ""))
        elif "configMap" in vol:
            cm = vol["configMap"]
            _check_fields(f"volume {vol['name']}.configMap", cm, {"name"})
            if cm["name"] not in config_maps:
                raise ManifestError(f"ConfigMap {cm['name']}: no directory given for it")
            volumes[vol["name"]] = (config_maps[cm["name"]], "configMap")
        else:
            raise ManifestError(f"volume {vol['name']}: only hostPath and configMap volumes are known")
    grace = spec.get("terminationGracePeriodSeconds")

    def one(c: Mapping[str, Any], *, init: bool) -> ContainerRun:
        _check_fields(
            f"container {c['name']}", c, CONTAINER_FIELDS_WITH_FLAGS | CONTAINER_FIELDS_WITHOUT_FLAGS
        )
        mounts = []
        for vm in c.get("volumeMounts", []):
            _check_fields(
                f"{c['name']} volumeMount", vm, {"name", "mountPath", "readOnly", "mountPropagation"}
            )
            host, host_type = volumes[vm["name"]]
            prop = vm.get("mountPropagation")
            if prop not in PROPAGATION:
                raise ManifestError(f"{c['name']}: mountPropagation {prop!r}")
            mounts.append(
                Mount(host, vm["mountPath"], bool(vm.get("readOnly")), PROPAGATION[prop], host_type)
            )
        privileged, cap_add, cap_drop = _security(c)
        memory, shares = _resources(c)
        return ContainerRun(
            name=c["name"],
            image=c["image"],
            command=tuple(c.get("command", ())),
            args=tuple(c.get("args", ())),
            env=_env(c, field_values),
            mounts=tuple(mounts),
            host_network=bool(spec.get("hostNetwork", False)),
            host_pid=bool(spec.get("hostPID", False)),
            privileged=privileged,
            cap_add=cap_add,
            cap_drop=cap_drop,
            memory_limit=memory,
            cpu_shares=shares,
            stop_timeout=None if init else grace,
            readiness=_exec_probe(c.get("readinessProbe")),
            liveness=_exec_probe(c.get("livenessProbe")),
        )

    inits = [one(c, init=True) for c in spec.get("initContainers", [])]
    mains = [one(c, init=False) for c in spec["containers"]]
    return inits, mains


def write_config_map(config_map: Mapping[str, Any], directory: Path) -> Path:
    """A ConfigMap's data as files in ``directory``, as the kubelet mounts it."""
    directory.mkdir(parents=True, exist_ok=True)
    for key, value in config_map.get("data", {}).items():
        (directory / key).write_text(value)
    return directory
