"""`nri-cni pods` in Multus's network-status shape and `nri-cni status` for probes."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from nri_cni.cli import health
from nri_cni.cni.cache import CacheEntry, ResultCache
from nri_cni.daemon.podreport import PodsView, network_status, pods_report, runtime_primaries
from nri_cni.pod.model import PodInfo
from tests.support.harness import DaemonHarness, new_pod_id, pod_message, run

ROOT = Path(__file__).resolve().parents[3]
SCHEMA = json.loads((ROOT / "docs" / "network-status.schema.json").read_text())


def valid_network_status(pods: list[dict]) -> None:
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    for pod in pods:
        jsonschema.validate(pod["network-status"], SCHEMA)


async def cli(*args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "nri_cni.cli",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    return proc.returncode, out.decode(), err.decode()


def entry(pod_id, network, ifname, result, **args) -> CacheEntry:
    return CacheEntry(
        container_id=pod_id,
        ifname=ifname,
        network_name=network,
        config=json.dumps({"cniVersion": "1.1.0", "name": network, "plugins": [{"type": "bridge"}]}).encode(),
        netns="/var/run/netns/x",
        cni_args=[
            ("K8S_POD_NAMESPACE", args.get("ns", "default")),
            ("K8S_POD_NAME", args.get("name", "web")),
        ],
        result=result,
    )


RUNTIME_ETH0 = {
    "cniVersion": "1.1.0",
    "interfaces": [
        {"name": "cni0", "mac": "aa:aa:aa:aa:aa:01"},
        {"name": "eth0", "mac": "0a:58:0a:58:00:05", "sandbox": "/var/run/netns/x"},
    ],
    "ips": [{"address": "10.88.0.5/16", "gateway": "10.88.0.1", "interface": 1}],
    "dns": {"nameservers": ["10.96.0.10"], "search": ["default.svc.cluster.local"]},
}


def test_an_element_has_multus_shape():
    element = network_status(entry("p" * 64, "cbr0", "eth0", RUNTIME_ETH0))
    assert element == {
        "name": "cbr0",
        "interface": "eth0",
        "ips": ["10.88.0.5"],
        "mac": "0a:58:0a:58:00:05",
        "default": True,
        "dns": {"nameservers": ["10.96.0.10"], "search": ["default.svc.cluster.local"]},
    }
    sriov = {
        "cniVersion": "1.1.0",
        "interfaces": [
            {
                "name": "net1",
                "mac": "02:00:00:00:00:07",
                "mtu": 9000,
                "pciID": "0000:03:00.2",
                "metadata": {"example.com/vf": "2"},
            }
        ],
        "ips": [{"address": "fd00::7/64"}],
    }
    element = network_status(entry("p" * 64, "default/sriov", "net1", sriov))
    assert "default" not in element and element["ips"] == ["fd00::7"]
    # the interface's MTU and its CNI metadata map travel with it (docs/containers.md)
    assert element["mtu"] == 9000 and element["metadata"] == {"example.com/vf": "2"}
    assert element["device-info"] == {
        "type": "pci",
        "version": "1.1.0",
        "pci": {"pci-address": "0000:03:00.2"},
    }
    jsonschema.validate([element], SCHEMA)


def test_secondary_report_has_the_runtimes_eth0_and_pods_without_extra_networks(tmp_path):
    """Secondary mode: eth0 is the runtime's (its libcni cache), and a pod that asked for no
    extra network is listed all the same."""
    ours, theirs = ResultCache(str(tmp_path / "ours")), ResultCache(str(tmp_path / "theirs"))
    a, b = "a" * 64, "b" * 64
    net1 = {
        "cniVersion": "1.1.0",
        "interfaces": [{"name": "net1", "mac": "02:00:00:00:00:01", "sandbox": "/x"}],
        "ips": [{"address": "192.0.2.10/24", "interface": 0}],
    }
    ours.write(entry(a, "fastnet", "net1", net1, name="with-extra"))
    theirs.write(entry(a, "cbr0", "eth0", RUNTIME_ETH0, name="with-extra"))
    theirs.write(entry(b, "cbr0", "eth0", RUNTIME_ETH0, name="plain"))
    listed = {
        p.id: p
        for p in (
            PodInfo(id=a, name="with-extra", namespace="default", netns="/x"),
            PodInfo(id=b, name="plain", namespace="default", netns="/y"),
            PodInfo(id="c" * 64, name="host", namespace="kube-system"),
        )
    }

    report = pods_report(ours.entries(), PodsView(listed), runtime_entries=runtime_primaries(theirs, "cbr0"))
    valid_network_status(report)
    by_name = {p["name"]: p for p in report}
    assert [(n["name"], n["interface"]) for n in by_name["with-extra"]["network-status"]] == [
        ("cbr0", "eth0"),
        ("fastnet", "net1"),
    ]
    assert [n["interface"] for n in by_name["plain"]["network-status"]] == ["eth0"]
    assert by_name["plain"]["state"] == "ready" and by_name["plain"]["attachedAt"] > 0
    assert by_name["host"]["network-status"] == [] and by_name["host"]["state"] == "host-network"


@pytest.mark.parametrize(
    ("change", "code"),
    [
        ({}, 0),
        ({"reload": {"refused": "config.yaml: networks[1]: bad"}}, 1),
        ({"networks": {"pods": {"ready": True, "default": True}, "lan": {"ready": False, "error": "x"}}}, 1),
        ({"pendingRepair": ["p1"]}, 1),
        ({"networks": {"pods": {"ready": False, "default": True, "error": "no bridge"}}}, 2),
        ({"nri": {"registered": True, "synchronized": False}}, 2),
    ],
)
def test_status_verdicts(change, code):
    report = {
        "nri": {"registered": True, "synchronized": True},
        "networks": {"pods": {"ready": True, "default": True}},
        "reload": {"refused": ""},
        "pendingRepair": [],
        "pendingRollback": [],
        **change,
    }
    verdict = health.assess(report)
    assert verdict.code == code, verdict
    assert bool(verdict.reasons) == (code != 0)


pytestmark = pytest.mark.netns


def test_pods_and_status_through_the_cli(node, tmp_path):
    """A running daemon (native mode, the runtime double): the table, -o json against the
    schema, exit 0 when ready, 1 when a config change is refused (and --watch shows the change),
    2 when the daemon is gone."""
    ns = node.jan.netns()
    nets = [{"name": "podnet", "default": True, "conflist": node.bridge_net("podnet", "10.244.38.0/24")}]
    cfg = node.config("native", nets, reload={"watch": True, "rescan_interval": 0, "debounce": "50ms"})
    config_file = tmp_path / "config.yaml"  # the harness's config path: hot reload watches it
    config_file.write_text(yaml.safe_dump(cfg))
    pod = pod_message(new_pod_id(), ns.path, name="web", namespace="default")
    sock = cfg["daemon"]["socket"]

    async def scenario():
        async with DaemonHarness(node, cfg) as h:
            await h.runtime.run_pod_sandbox(pod)
            code, table, _ = await cli("pods", "--socket", sock)
            assert code == 0
            header, row = table.splitlines()[:2]
            assert header.split() == [
                "POD", "STATE", "VERIFY", "NETWORK", "INTERFACE", "IPS", "MAC", "AGE", "REASON"
            ]  # fmt: skip
            cells = row.split()  # not verified yet: "-", and no reason
            assert cells[:5] == ["default/web", "ready", "-", "podnet", "eth0"] and cells[5].startswith(
                "10.244.38."
            )
            assert cells[7].endswith("s") and len(cells) == 8
            code, raw, _ = await cli("pods", "--socket", sock, "-o", "json")
            data = json.loads(raw)
            valid_network_status(data)
            assert data[0]["id"] == pod.id and data[0]["network-status"][0]["default"] is True
            code, out, _ = await cli("status", "--socket", sock)
            assert code == 0 and "health:     ready" in out
            watch = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "nri_cni.cli",
                "status",
                "--socket",
                sock,
                "--watch",
                "0.1",
                "-o",
                "json",
                stdout=asyncio.subprocess.PIPE,
            )
            try:
                first = json.loads(await asyncio.wait_for(watch.stdout.readline(), 60))
                assert first["health"] == "ready"
                good = config_file.read_text()
                config_file.write_text(good + "networks:\n  - name: [unclosed\n")
                second = json.loads(await asyncio.wait_for(watch.stdout.readline(), 60))
                assert second["health"] == "degraded" and "not valid YAML" in second["reasons"][0]
                code, out, _ = await cli("status", "--socket", sock)
                assert code == 1 and "health:     degraded: config change refused" in out
                config_file.write_text(good)  # the same file as the running one: the refusal goes
                third = json.loads(await asyncio.wait_for(watch.stdout.readline(), 60))
                assert third["health"] == "ready" and third["reload"]["refused"] == ""
            finally:
                watch.terminate()
                await watch.wait()
            await h.runtime.stop_pod_sandbox(pod)
            await h.runtime.remove_pod_sandbox(pod)
        code, _, err = await cli("status", "--socket", sock)
        assert code == 2 and "not reachable" in err

    run(scenario())
