"""Per-node values in a config every node shares: `${node.KEY}` placeholders.

A DaemonSet gives every node the same ConfigMap, yet some settings differ between nodes (a
bridge network's pod subnet, a macvlan master). The config file names them as `${node.KEY}`;
the values come from a YAML mapping, node name -> {KEY: value}, with "*" for defaults:

    # nodes.yaml, beside config.yaml (or the file $NRI_CNI_NODE_VALUES names)
    "*":    {uplink: eth1}
    node-a: {podSubnet: 10.244.1.0/24}
    node-b: {podSubnet: 10.244.2.0/24, uplink: ens5}

The node is $NODE_NAME (the DaemonSet sets it from `spec.nodeName`), else the host name. The
placeholders are replaced in the file's text before it is parsed, so a value can sit anywhere,
inline conflists included; a placeholder with no value for this node refuses the config, with
the node and the key named. A config without placeholders reads no values file. The values file
sits in the config's directory, which hot reload watches: editing it is a reload like any other.
"""

from __future__ import annotations

import os
import re
import socket

import yaml

from nri_cni.errors import ConfigError

PLACEHOLDER = re.compile(r"\$\{node\.([A-Za-z0-9_.-]+)\}")
VALUES_FILE = "nodes.yaml"
VALUES_ENV = "NRI_CNI_NODE_VALUES"
NODE_ENV = "NODE_NAME"
MAX_VALUES_BYTES = 1024 * 1024


def node_name() -> str:
    return os.environ.get(NODE_ENV) or socket.gethostname()


def values_path(config_path: str) -> str:
    return os.environ.get(VALUES_ENV) or os.path.join(
        os.path.dirname(os.path.abspath(config_path)), VALUES_FILE
    )


def node_values(path: str, node: str) -> dict[str, str]:
    """The values for `node`: the "*" entry overlaid by the node's own."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_VALUES_BYTES + 1)
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc.strerror or exc}", location=path) from None
    if len(data) > MAX_VALUES_BYTES:
        raise ConfigError(f"larger than {MAX_VALUES_BYTES} bytes", location=path)
    try:
        doc = yaml.safe_load(data) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"not valid YAML: {exc}".replace("\n", " "), location=path) from None
    if not isinstance(doc, dict):
        raise ConfigError("must be a mapping: node name -> {KEY: value}", location=path)
    out: dict[str, str] = {}
    for key in ("*", node):
        entry = doc.get(key) or {}
        if not isinstance(entry, dict):
            raise ConfigError(f"{key!r} must map keys to values", location=path)
        for k, v in entry.items():
            if isinstance(v, (dict, list)) or v is None:
                raise ConfigError(f"{key}.{k}: a value must be a string or a number", location=path)
            out[str(k)] = str(v).lower() if isinstance(v, bool) else str(v)
    return out


def expand(text: str, config_path: str) -> str:
    """The config text with every `${node.KEY}` replaced by this node's value."""
    keys = PLACEHOLDER.findall(text)
    if not keys:
        return text
    node, path = node_name(), values_path(config_path)
    values = node_values(path, node)
    missing = sorted({k for k in keys if k not in values})
    if missing:
        raise ConfigError(
            f"no value for {', '.join('${node.' + k + '}' for k in missing)} on node {node!r} "
            f"(add it under {node!r} or '*' in {path}; the node is ${NODE_ENV} or the host name)",
            location=config_path,
        )
    return PLACEHOLDER.sub(lambda m: values[m.group(1)], text)
