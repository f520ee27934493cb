"""NetworkAttachmentDefinition files (nri_cni/config/nad.py): parsing, namespace isolation, errors
with their file, check-config's listing (with the _finalize.d drop-ins it loaded)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from nri_cni.config import load_config
from nri_cni.errors import AnnotationRefused, ConfigError
from nri_cni.pod.select import select_networks

ANN = "k8s.v1.cni.cncf.io/networks"


def nad_doc(name, namespace="default", config=None, **over):
    conf = config if config is not None else {"cniVersion": "1.0.0", "name": f"{name}-net", "type": "macvlan"}
    doc = {
        "apiVersion": "k8s.cni.cncf.io/v1",
        "kind": "NetworkAttachmentDefinition",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"config": json.dumps(conf) if isinstance(conf, dict) else conf},
    }
    doc.update(over)
    return doc


def write_config(tmp_path, nads: dict[str, list[dict]]):
    nad_dir = tmp_path / "nad.d"
    nad_dir.mkdir(exist_ok=True)
    for file, docs in nads.items():
        (nad_dir / file).write_text(yaml.safe_dump_all(docs))
    (tmp_path / "net.d" / "_finalize.d").mkdir(parents=True, exist_ok=True)
    cfg = {
        "mode": "shim",
        "cni": {"finalize_dir": str(tmp_path / "net.d" / "_finalize.d"), "cache_dir": str(tmp_path / "c")},
        "nad_dir": str(nad_dir),
        "networks": [
            {
                "name": "podnet",
                "default": True,
                "conflist": {"cniVersion": "1.1.0", "name": "podnet", "plugins": [{"type": "bridge"}]},
            }
        ],
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_nads_are_networks_of_their_namespace(tmp_path):
    path = write_config(
        tmp_path,
        {
            "a.yaml": [nad_doc("macvlan-conf", "default"), nad_doc("macvlan-conf", "team-b")],
            "b.yml": [
                nad_doc(
                    "sriov",
                    "team-b",
                    config={"cniVersion": "1.1.0", "name": "sriov-b", "plugins": [{"type": "sriov"}]},
                )
            ],
            ".hidden.yaml": [{"kind": "garbage"}],
        },
    )
    # the two macvlan-conf NADs of different namespaces need different CNI names (the cache key)
    with pytest.raises(ConfigError) as info:
        load_config(str(path))
    assert "the CNI network name 'macvlan-conf-net'" in str(info.value) and "a.yaml[1]" in str(info.value)

    path = write_config(  # b.yml stays; .hidden.yaml is skipped
        tmp_path,
        {
            "a.yaml": [
                nad_doc("macvlan-conf", "default"),
                nad_doc(
                    "macvlan-conf",
                    "team-b",
                    config={"cniVersion": "1.0.0", "name": "mv-b", "type": "macvlan"},
                ),
            ]
        },
    )
    cfg = load_config(str(path))
    nads = {n.nad: n for n in cfg.networks if n.nad}
    assert set(nads) == {"default/macvlan-conf", "team-b/macvlan-conf", "team-b/sriov"}
    assert nads["team-b/macvlan-conf"].namespaces == ("team-b",) and not nads["team-b/macvlan-conf"].default
    assert [p.type for p in nads["default/macvlan-conf"].conflist.plugins] == [
        "macvlan"
    ]  # a single conf, wrapped
    # the annotation means the NAD of the pod's own namespace; another namespace's is refused
    got = select_networks(cfg, "team-b", {ANN: "macvlan-conf"})
    assert [(s.network.name, s.ifname) for s in got] == [("podnet", "eth0"), ("mv-b", "net1")]
    got = select_networks(cfg, "default", {ANN: "default/macvlan-conf@fast0"})
    assert [(s.network.nad, s.ifname) for s in got[1:]] == [("default/macvlan-conf", "fast0")]
    with pytest.raises(AnnotationRefused):
        select_networks(cfg, "default", {ANN: "sriov"})
    with pytest.raises(AnnotationRefused):
        select_networks(cfg, "default", {ANN: "team-b/macvlan-conf"})


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        (
            nad_doc("x", kind="ConfigMap"),
            "apiVersion/kind must be k8s.cni.cncf.io/v1 / NetworkAttachmentDefinition",
        ),
        (nad_doc("Bad_Name"), "is not a Kubernetes object name"),
        (nad_doc("x", config=""), "spec.config is empty"),
        (nad_doc("x", config="{not json"), "spec.config is not JSON"),
        (nad_doc("x", config={"cniVersion": "1.0.0", "name": "x"}), "plugin config has no 'type'"),
    ],
)
def test_a_bad_nad_is_refused_with_its_file(tmp_path, doc, message):
    path = write_config(tmp_path, {"x.yaml": [doc]})
    with pytest.raises(ConfigError) as info:
        load_config(str(path))
    assert message in str(info.value) and "x.yaml" in str(info.value)


def test_check_config_lists_nads_and_the_finalize_drop_ins(tmp_path):
    path = write_config(tmp_path, {"a.yaml": [nad_doc("macvlan-conf")]})
    dropins = tmp_path / "net.d" / "_finalize.d"
    (dropins / "10-probe.conf").write_text('{"type": "probe"}')
    (dropins / "20-tune.conf").write_text('{"type": "tuning"}')
    out = subprocess.run(
        [sys.executable, "-m", "nri_cni.cli", "check-config", "--config", str(path)],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    assert "(NetworkAttachmentDefinition default/macvlan-conf, " in out.stdout
    assert f"finalize drop-ins from {dropins}, for every network: [probe tuning]" in out.stdout
    (dropins / "30-bad.conf").write_text("{")
    out = subprocess.run(
        [sys.executable, "-m", "nri_cni.cli", "check-config", "--config", str(path)],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2 and "30-bad.conf" in out.stderr
