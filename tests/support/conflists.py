"""The CNI network lists the tests and bench/ give nri-cni or a runtime, the entry that names one
in nri-cni's config, and a network as a NetworkAttachmentDefinition file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml


def host_local(ipam_dir: str | Path, *subnets: str) -> dict[str, Any]:
    """host-local IPAM keeping its reservations under `ipam_dir`: one range per subnet (a pod
    gets an address of each)."""
    return {"type": "host-local", "dataDir": str(ipam_dir), "ranges": [[{"subnet": s}] for s in subnets]}


def portmap(*, snat: bool = True) -> dict[str, Any]:
    """portmap for the pod's port mappings; `snat=False`: no hairpin masquerade rules."""
    conf: dict[str, Any] = {"type": "portmap", "capabilities": {"portMappings": True}}
    if not snat:
        conf["snat"] = False
    return conf


def bridge_conflist(
    name: str,
    bridge: str,
    ipam: dict[str, Any],
    *,
    version: str = "1.1.0",
    gateway: bool = True,
    then: tuple[dict[str, Any], ...] | list[dict[str, Any]] = (),
) -> dict[str, Any]:
    """The bridge plugin on `bridge`, then `then`."""
    return conflist(name, bridge_plugin(bridge, ipam, gateway=gateway), *then, version=version)


def bridge_plugin(bridge: str, ipam: dict[str, Any], *, gateway: bool = True) -> dict[str, Any]:
    """The bridge plugin's entry on `bridge` (no masquerade: nothing leaves the node)."""
    return {"type": "bridge", "bridge": bridge, "isGateway": gateway, "ipMasq": False, "ipam": ipam}


def conflist(name: str, *plugins: dict[str, Any], version: str = "1.1.0") -> dict[str, Any]:
    """The network list `name` of `plugins`, in order."""
    return {"cniVersion": version, "name": name, "plugins": list(plugins)}


def macvlan_conflist(
    name: str, master: str, ipam: dict[str, Any], *, version: str = "1.1.0"
) -> dict[str, Any]:
    """macvlan in bridge mode over `master`."""
    plugin = {"type": "macvlan", "master": master, "mode": "bridge", "ipam": ipam}
    return {"cniVersion": version, "name": name, "plugins": [plugin]}


def network(conflist: dict[str, Any], *, default: bool = True, **keys: Any) -> dict[str, Any]:
    """The entry of nri-cni's `networks` that attaches `conflist` (by its name)."""
    return {"name": conflist["name"], "default": default, **keys, "conflist": conflist}


def nad(name: str, master: str, subnet: str, ipam_dir: str, namespace: str = "nct-e2e") -> str:
    """A NetworkAttachmentDefinition file (YAML) for macvlan over `master`, as Multus reads one."""
    config = {
        "cniVersion": "1.0.0",
        "name": f"{name}-net",
        "type": "macvlan",
        "master": master,
        "mode": "bridge",
        "ipam": {"type": "host-local", "dataDir": ipam_dir, "ranges": [[{"subnet": subnet}]]},
    }
    return yaml.safe_dump(
        {
            "apiVersion": "k8s.cni.cncf.io/v1",
            "kind": "NetworkAttachmentDefinition",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"config": json.dumps(config)},
        }
    )
