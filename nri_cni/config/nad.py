"""Networks written as Multus NetworkAttachmentDefinitions: YAML files in a directory.

The format Multus admins already write (k8s.cni.cncf.io/v1, network-attachment-definition-client):

    apiVersion: k8s.cni.cncf.io/v1
    kind: NetworkAttachmentDefinition
    metadata: {name: macvlan-conf, namespace: default}
    spec:
      config: '{"cniVersion": "1.0.0", "name": "macvlan-conf", "type": "macvlan", ...}'

Each NAD becomes a network pods of its namespace may ask for with the usual annotation
(`k8s.v1.cni.cncf.io/networks: macvlan-conf` or `default/macvlan-conf`), as with Multus's
namespace isolation: a NAD serves the pods of its own namespace only. `spec.config` is a CNI
network list or a single plugin config (wrapped into a list as libcni does); its `name` is the
CNI network name (the cache key), unique among all of nri-cni's networks. A NAD with no
`spec.config` (Multus then reads a file of that name from its conf dir) is refused: nri-cni
reads only what the directory holds. The files are read with the config file, so hot reload
covers them; a file that does not validate refuses the whole change, as any config error does.
Files: `*.yaml`, `*.yml`, `*.json` in lexical order, several documents per file allowed; hidden
names (editors' temp files, a ConfigMap volume's `..data`) are skipped.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from typing import Any

import yaml

from nri_cni.cni.config import NetworkConfigList, parse_conflist
from nri_cni.errors import ConfigError
from nri_cni.lifecycle.spec import validate_list

API_VERSION = "k8s.cni.cncf.io/v1"
KIND = "NetworkAttachmentDefinition"
EXTENSIONS = (".yaml", ".yml", ".json")
MAX_FILE_BYTES = 1024 * 1024  # a NAD is a few hundred bytes; Kubernetes objects stop at 1.5 MiB
# a Kubernetes object name (DNS-1123 subdomain) and namespace (DNS-1123 label)
_OBJECT_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
_NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def nad_files(directory: str) -> list[str]:
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        return []  # not there yet: the reload watches for it
    except OSError as exc:
        raise ConfigError(f"cannot list: {exc.strerror or exc}", location=directory) from None
    return [
        os.path.join(directory, n)
        for n in names
        if not n.startswith(".") and n.endswith(EXTENSIONS) and os.path.isfile(os.path.join(directory, n))
    ]


def load_nad_dir(directory: str) -> tuple[list[tuple[str, Any]], list[ConfigError]]:
    """([("namespace/name", NetworkConfigList)], errors) for every NAD of the directory."""
    out: list[tuple[str, Any]] = []
    errors: list[ConfigError] = []
    try:
        files = nad_files(directory)
    except ConfigError as exc:
        return [], [exc]
    for path in files:
        try:
            for i, doc in enumerate(_documents(path)):
                if doc is None:
                    continue
                out.append(parse_nad(doc, f"{path}[{i}]" if i else path))
        except ConfigError as exc:
            errors.append(exc)
    return out, errors


def _documents(path: str) -> Iterable[Any]:
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc.strerror or exc}", location=path) from None
    if len(data) > MAX_FILE_BYTES:
        raise ConfigError(f"larger than {MAX_FILE_BYTES} bytes", location=path)
    try:
        return list(yaml.safe_load_all(data))
    except yaml.YAMLError as exc:
        raise ConfigError(f"not valid YAML: {exc}".replace("\n", " "), location=path) from None


def parse_nad(doc: Any, where: str) -> tuple[str, Any]:
    """One NetworkAttachmentDefinition object -> ("namespace/name", NetworkConfigList)."""
    if not isinstance(doc, dict):
        raise ConfigError("a NetworkAttachmentDefinition must be a mapping", location=where)
    if doc.get("apiVersion") != API_VERSION or doc.get("kind") != KIND:
        raise ConfigError(
            f"apiVersion/kind must be {API_VERSION} / {KIND}, not "
            f"{doc.get('apiVersion')!r} / {doc.get('kind')!r}",
            location=where,
        )
    meta = doc.get("metadata")
    if not isinstance(meta, dict):
        raise ConfigError("metadata is missing", location=where)
    name, namespace = meta.get("name"), meta.get("namespace", "default")
    if not isinstance(name, str) or not _OBJECT_NAME.match(name) or len(name) > 253:
        raise ConfigError(f"metadata.name {name!r} is not a Kubernetes object name", location=where)
    if not isinstance(namespace, str) or not _NAMESPACE.match(namespace) or len(namespace) > 63:
        raise ConfigError(f"metadata.namespace {namespace!r} is not a Kubernetes namespace", location=where)
    spec = doc.get("spec")
    config = spec.get("config") if isinstance(spec, dict) else None
    if not config:
        raise ConfigError(
            "spec.config is empty: nri-cni needs the CNI config in the NAD "
            "(it does not look up a conf file by the NAD's name, as Multus can)",
            location=where,
        )
    if not isinstance(config, str):
        raise ConfigError("spec.config must be a string holding the CNI JSON", location=where)
    try:
        conf = json.loads(config)
    except ValueError as exc:
        raise ConfigError(f"spec.config is not JSON: {exc}", location=where) from None
    if not isinstance(conf, dict):
        raise ConfigError("spec.config must be a JSON object", location=where)
    if "plugins" not in conf:  # one plugin: a list of one, as libcni's ConfListFromConf
        conf = {"cniVersion": conf.get("cniVersion", ""), "name": conf.get("name"), "plugins": [conf]}
    lst = parse_conflist(conf, source=where)
    validate_list(lst, where)
    return f"{namespace}/{name}", lst


def nad_networks(
    directory: str, taken: Iterable[str]
) -> tuple[list[tuple[str, NetworkConfigList]], list[ConfigError]]:
    """The NADs of `directory` as ("namespace/name", conflist): config.py makes each a network
    on request, in its own namespace only. `taken`: the CNI network names the config already
    has (the cache key must stay unique)."""
    loaded, errors = load_nad_dir(directory)
    names = set(taken)
    nads: set[str] = set()
    out = []
    for key, lst in loaded:
        if key in nads:
            errors.append(
                ConfigError(f"NetworkAttachmentDefinition {key} is defined twice", location=lst.source)
            )
            continue
        if lst.name in names:
            errors.append(
                ConfigError(
                    f"the CNI network name {lst.name!r} (spec.config name) is used by another network",
                    location=lst.source,
                )
            )
            continue
        nads.add(key)
        names.add(lst.name)
        out.append((key, lst))
    return out, errors


def lookup(networks: Iterable[Any], namespace: str, name: str) -> Any:
    """The network a pod of `namespace` means by `name` in its annotation: its namespace's NAD
    of that name first (Multus's meaning), else a network of the config file by name."""
    by_name = None
    for net in networks:
        if net.nad:
            if net.nad == f"{namespace}/{name}":
                return net
        elif net.name == name:
            by_name = net
    return by_name
