"""Per-node values (`${node.KEY}`, nri_cni/config/nodevalues.py): one config for every node of a
DaemonSet, each node's subnet from nodes.yaml, hot-reloaded like the config itself."""

from __future__ import annotations

import asyncio

import pytest
import yaml

from nri_cni.config import load_config
from nri_cni.errors import ConfigError
from tests.support.reloading import base_config, refusal, start, write

BRIDGE = {
    "name": "pods",
    "default": True,
    "conflist": {
        "cniVersion": "1.1.0",
        "name": "pods",
        "plugins": [
            {
                "type": "bridge",
                "bridge": "${node.bridge}",
                "ipam": {"type": "host-local", "subnet": "${node.podSubnet}"},
            }
        ],
    },
}


def ipam(cfg) -> dict:
    return cfg.network("pods").conflist.plugins[0].conf


@pytest.fixture(autouse=True)
def node_a(monkeypatch):
    monkeypatch.setenv("NODE_NAME", "node-a")
    monkeypatch.delenv("NRI_CNI_NODE_VALUES", raising=False)


def test_values_per_node_with_defaults(tmp_path, monkeypatch):
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(base_config(tmp_path, [BRIDGE])))
    (tmp_path / "nodes.yaml").write_text(
        yaml.safe_dump(
            {
                "*": {"bridge": "cni0"},
                "node-a": {"podSubnet": "10.1.1.0/24"},
                "node-b": {"podSubnet": "10.1.2.0/24", "bridge": "br9"},
            }
        )
    )
    conf = ipam(load_config(str(path)))
    assert (conf["bridge"], conf["ipam"]["subnet"]) == ("cni0", "10.1.1.0/24")
    monkeypatch.setenv("NODE_NAME", "node-b")
    conf = ipam(load_config(str(path)))
    assert (conf["bridge"], conf["ipam"]["subnet"]) == ("br9", "10.1.2.0/24")
    monkeypatch.setenv("NODE_NAME", "node-c")
    with pytest.raises(ConfigError) as info:
        load_config(str(path))
    assert "no value for ${node.podSubnet} on node 'node-c'" in str(info.value)
    assert str(tmp_path / "nodes.yaml") in str(info.value)


def test_a_values_file_elsewhere_and_a_bad_one(tmp_path, monkeypatch):
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(base_config(tmp_path, [BRIDGE])))
    other = tmp_path / "values.yaml"
    other.write_text(yaml.safe_dump({"node-a": {"podSubnet": "10.9.0.0/16", "bridge": "b0"}}))
    monkeypatch.setenv("NRI_CNI_NODE_VALUES", str(other))
    assert ipam(load_config(str(path)))["ipam"]["subnet"] == "10.9.0.0/16"
    other.write_text(yaml.safe_dump({"node-a": {"podSubnet": ["a", "list"]}}))
    with pytest.raises(ConfigError, match="must be a string or a number"):
        load_config(str(path))


def test_editing_nodes_yaml_reloads_the_config(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(base_config(tmp_path, [BRIDGE])))
    values = tmp_path / "nodes.yaml"
    values.write_text(yaml.safe_dump({"node-a": {"podSubnet": "10.1.1.0/24", "bridge": "cni0"}}))

    async def scenario():
        reloader, applied = start(path)
        await reloader.start()
        write(values, yaml.safe_dump({"node-a": {"podSubnet": "10.1.7.0/24", "bridge": "cni0"}}))
        cfg = await applied.next()
        assert ipam(cfg)["ipam"]["subnet"] == "10.1.7.0/24"
        write(values, yaml.safe_dump({"node-b": {"podSubnet": "10.1.8.0/24"}}))  # node-a's values gone
        await refusal(reloader)
        assert "on node 'node-a'" in reloader.report()["refused"]
        await reloader.close()

    asyncio.run(scenario())
