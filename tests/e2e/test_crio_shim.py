"""Shim mode on a real CRI-O 1.36: nri-cni-shim is CRI-O's only CNI network (the shipped
config/crio files: the drop-in as it is, the conflist with only its socket path changed); the
daemon attaches the pod's plan (bridge eth0 with portmap, macvlan net1 by annotation, a
FINALIZE drop-in). CRI-O runs CNI ADD, then CHECK, then NRI RUN_POD_SANDBOX; on stop CNI DEL,
then unpins the netns, then NRI STOP; a remove without a stop sends CNI DEL and NRI REMOVE only.
"""

from __future__ import annotations

import ipaddress
import json
import random
import uuid

import pytest

from tests.support.conflists import nad
from tests.support.crionode import crio_rnode, runtime_leaks  # noqa: F401 (fixture)
from tests.support.finalize_probe import probe_calls
from tests.support.firewall import iptables_lines
from tests.support.hostlocal import host_local_reservations
from tests.support.podtruth import whole_problems

pytestmark = pytest.mark.e2e

NETWORKS_ANNOTATION = "k8s.v1.cni.cncf.io/networks"


def _start(node):
    crio = node.start_containerd()
    fastnet = node.fastnet()
    fastnet["default"] = False  # by annotation only
    fastnet["namespaces"] = ["nct-e2e"]
    daemon = node.start_daemon(node.daemon_config([node.podnet(finalize=False), fastnet]))
    return crio, daemon


def test_shipped_dropin_is_what_crio_runs(crio_rnode):
    node = crio_rnode
    crio = node.start_containerd()
    effective = crio.running_config()["crio"]
    assert effective["network"]["cni_default_network"] == "nri-cni"  # from config/crio as shipped
    assert effective["nri"]["enable_nri"] is True
    assert effective["nri"]["nri_plugin_request_timeout"] == "10s"
    assert effective["nri"]["nri_listen"] == crio.nri_socket  # the test's own paths win
    assert crio.cri.version().runtime_name == "cri-o"


def test_pods_get_eth0_extra_network_finalize_and_leave_nothing(crio_rnode):
    node = crio_rnode
    crio, daemon = _start(node)
    checker = node.leak_checker().start()
    pods = [
        node.run_pod(f"web-{i}", ports=False, annotations={NETWORKS_ANNOTATION: "fastnet"}) for i in range(3)
    ]
    host_port = random.randrange(20000, 40000)
    mapping = {"protocol": "tcp", "container_port": 80, "host_port": host_port}
    plain = crio.cri.run_pod("plain", "nct-e2e", str(uuid.uuid4()), port_mappings=[mapping])
    statuses = {p: crio.cri.pod_status(p) for p in pods + [plain]}
    checker.add_markers(*statuses, *(st.ip for st in statuses.values()))
    table = {p["id"]: p for p in daemon.pods()}
    assert set(table) == set(statuses)
    runtime = {p.id: p for p in node.runtime_pods()}
    for pod, st in statuses.items():
        assert st.ready
        want = ["eth0", "net1"] if pod in pods else ["eth0"]
        # CRI's IP == the address in the netns == what `nri-cni pods` reports
        assert ipaddress.ip_address(st.ip) in ipaddress.ip_network(node.eth0_subnet)
        assert whole_problems(runtime[pod], want) == []
        assert [n["interface"] for n in table[pod]["network-status"]] == want
        assert table[pod]["network-status"][0]["ips"] == [st.ip]
        # FINALIZE once per network, after every ADD of the pod (all its links there)
        calls = probe_calls(node.probe_log, pod)
        assert [ifname for _, ifname, _ in calls] == want, calls
        links = ",".join(sorted([*want, "lo"]))
        assert all(verb == "FINALIZE" and seen == links for verb, _, seen in calls), calls
    # hostPorts: CRI-O 1.36 hands CNI no port mappings (its libcni runtimeConfig carries
    # bandwidth, cgroup path and annotations only), so the portmap plugin of nri-cni's network
    # maps nothing; CRI-O maps them itself unless disable_hostport_mapping (on here) says no
    assert "PortMappings:[]" in crio.log_path.read_text().split("Name:plain ", 1)[1].split("\n", 1)[0]
    assert [ln for ln in iptables_lines() if f"--dport {host_port}" in ln] == []
    checker.learn()
    # CRI-O ran CNI CHECK of the shim's network right after each ADD, and nri-cni answered it
    # from its records (netlink showing the pod as the ADD left it): one `check` operation per
    # pod, marked so, and no plugin's CHECK call in any record of the pod
    assert crio.log_path.read_text().count("Checking pod nct-e2e_") >= len(statuses)
    for pod in statuses:
        ops = [op for op in daemon.op_lines() if op["podId"] == pod]
        assert [op["op"] for op in ops] == ["add", "check"], ops
        assert ops[1]["from"] == "records" and ops[1]["plugins"] == [], ops[1]
        assert ops[1]["result"] == "ok"
        assert "CHECK" not in {p["command"] for op in ops for p in op["plugins"]}
    for pod in statuses:
        node.remove_pod(pod)
    dels = [op for op in daemon.op_lines() if op["podId"] in statuses and op["op"] == "del"]
    assert len(dels) == len(statuses) and all({p["command"] for p in op["plugins"]} == {"DEL"} for op in dels)
    assert host_local_reservations(node.setup.ipam_dir) == []
    assert daemon.pods() == []
    assert node.intents() == [] and node.cache_files() == []
    assert runtime_leaks(crio, statuses) == []
    assert checker.leaks() == []


def test_remove_without_stop(crio_rnode):
    node = crio_rnode
    crio, daemon = _start(node)
    checker = node.leak_checker().start()
    pod = node.run_pod("nostop", annotations={NETWORKS_ANNOTATION: "fastnet"})
    checker.add_markers(pod, crio.cri.pod_status(pod).ip)
    checker.learn()
    assert len(node.reserved_for(pod)) == 2
    crio.cri.remove_pod(pod)  # CNI DEL through the shim, then NRI REMOVE only
    assert crio.cri.list_pods() == []
    assert host_local_reservations(node.setup.ipam_dir) == []
    assert daemon.pods() == []
    assert runtime_leaks(crio, [pod]) == []
    assert checker.leaks() == []


def test_extra_networks_by_annotation_forms_and_network_attachment_definition(crio_rnode, tmp_path):
    """The Multus annotation in its forms (name, namespace/name, name@interface, JSON) naming a
    network of nri-cni's config or a NetworkAttachmentDefinition file, on CRI-O."""
    node = crio_rnode
    nad_dir = tmp_path / "nad.d"
    nad_dir.mkdir()
    nad_subnet = node.net1_subnet.replace(".0/24", ".128/25")
    (nad_dir / "mv.yaml").write_text(nad("mv-conf", node.master, nad_subnet, str(node.setup.ipam_dir)))
    fastnet = node.fastnet()
    fastnet["conflist"]["plugins"][0]["ipam"]["ranges"] = [
        [{"subnet": node.net1_subnet.replace(".0/24", ".0/25")}]
    ]
    fastnet["default"] = False
    fastnet["namespaces"] = ["nct-e2e"]
    crio = node.start_containerd()
    daemon = node.start_daemon(
        node.daemon_config([node.podnet(finalize=False), fastnet], nad_dir=str(nad_dir))
    )
    checker = node.leak_checker().start()
    forms = {
        "fastnet": [("fastnet", "net1")],
        "nct-e2e/mv-conf": [("nct-e2e/mv-conf", "net1")],
        "fastnet@fast0, mv-conf@mv0": [("fastnet", "fast0"), ("nct-e2e/mv-conf", "mv0")],
        json.dumps([{"name": "mv-conf", "namespace": "nct-e2e", "interface": "mv1"}]): [
            ("nct-e2e/mv-conf", "mv1")
        ],
    }
    pods = {
        node.run_pod(f"forms-{i}", ports=False, annotations={NETWORKS_ANNOTATION: value}): want
        for i, (value, want) in enumerate(forms.items())
    }
    table = {p["id"]: p["network-status"] for p in daemon.pods()}
    runtime = {p.id: p for p in node.runtime_pods()}
    for pod, want in pods.items():
        checker.add_markers(pod, runtime[pod].ips[0])
        listed = [(n["name"], n["interface"]) for n in table[pod]]
        assert listed[0] == ("podnet", "eth0") and sorted(listed[1:]) == sorted(want), listed
        assert whole_problems(runtime[pod], ["eth0", *(i for _, i in want)]) == []
    checker.learn()
    for pod in pods:
        node.remove_pod(pod)
    assert host_local_reservations(node.setup.ipam_dir) == []
    assert daemon.pods() == [] and runtime_leaks(crio, pods) == []
    assert checker.leaks() == []
