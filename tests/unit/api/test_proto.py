"""The generated protobuf code: up to date, upstream's field numbers, wire compatibility."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, unknown_fields

from nri_cni.api import nri_pb2, ttrpc_pb2
from nri_cni.tools import genproto


def test_checked_in_code_is_current():
    proc = subprocess.run(
        [sys.executable, "-m", "nri_cni.tools.genproto", "--check"], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_check_notices_stale_code(tmp_path, monkeypatch, capsys):
    stale = tmp_path / "api"
    shutil.copytree(genproto.OUT_DIR, stale)
    (stale / "nri_pb2.py").write_text((stale / "nri_pb2.py").read_text() + "# edited\n")
    (stale / "ttrpc_pb2.pyi").unlink()
    monkeypatch.setattr(genproto, "OUT_DIR", stale)
    assert genproto.check() == 1
    err = capsys.readouterr().err
    assert "nri_pb2.py" in err and "ttrpc_pb2.pyi" in err and "rpc_status_pb2" not in err


def test_imports_between_our_modules_become_relative():
    text = "import rpc_status_pb2 as rpc__status__pb2\nimport os as x\n"
    assert genproto.rewrite_imports(text) == (
        "from . import rpc_status_pb2 as rpc__status__pb2\nimport os as x\n"
    )


# From containerd/nri pkg/api/api.proto (8ec8b28), PR #295, PR #304 and ttrpc request.proto.
UPSTREAM_FIELDS = {
    nri_pb2.RegisterPluginRequest: {"plugin_name": 1, "plugin_idx": 2, "NRI_version": 3},
    nri_pb2.ConfigureRequest: {
        "config": 1,
        "runtime_name": 2,
        "runtime_version": 3,
        "registration_timeout": 4,
        "request_timeout": 5,
        "NRI_version": 6,
    },
    nri_pb2.ConfigureResponse: {"events": 2, "request_timeout": 3},
    nri_pb2.SynchronizeRequest: {"pods": 1, "containers": 2, "more": 3},
    nri_pb2.SynchronizeResponse: {"update": 1, "more": 2},
    nri_pb2.RunPodSandboxRequest: {"pod": 1},
    nri_pb2.RunPodSandboxResponse: {"adjust": 1},
    nri_pb2.PodSandboxAdjustment: {"network": 1},
    nri_pb2.StopPodSandboxRequest: {"pod": 1},
    nri_pb2.RemovePodSandboxRequest: {"pod": 1},
    nri_pb2.StateChangeEvent: {"event": 1, "pod": 2, "container": 3},
    nri_pb2.PodSandbox: {
        "id": 1,
        "name": 2,
        "uid": 3,
        "namespace": 4,
        "labels": 5,
        "annotations": 6,
        "runtime_handler": 7,
        "linux": 8,
        "pid": 9,
        "ips": 10,
    },
    nri_pb2.LinuxPodSandbox: {"cgroup_parent": 3, "cgroups_path": 4, "namespaces": 5},
    nri_pb2.LinuxNamespace: {"type": 1, "path": 2},
    nri_pb2.Container: {
        "id": 1,
        "pod_sandbox_id": 2,
        "name": 3,
        "state": 4,
        "labels": 5,
        "annotations": 6,
        "args": 7,
        "env": 8,
        "pid": 12,
        "created_at": 14,
        "started_at": 15,
        "finished_at": 16,
        "exit_code": 17,
        "status_reason": 18,
        "status_message": 19,
    },
    nri_pb2.ContainerUpdate: {"container_id": 1, "ignore_failure": 3},
    nri_pb2.PodSandboxNetwork: {"ips": 1, "interfaces": 1001, "routes": 1002, "dns": 1003},
    nri_pb2.NetworkInterface: {
        "network": 1,
        "name": 2,
        "mac": 3,
        "mtu": 4,
        "sandbox": 5,
        "pci_id": 6,
        "socket_path": 7,
        "ips": 8,
        "metadata": 9,
    },
    nri_pb2.IPConfig: {"address": 1, "gateway": 2},
    nri_pb2.NetworkRoute: {"network": 1, "dst": 2, "gw": 3, "mtu": 4, "table": 5, "scope": 6, "interface": 7},
    nri_pb2.NetworkDNS: {"nameservers": 1, "domain": 2, "search": 3, "options": 4},
    ttrpc_pb2.Request: {"service": 1, "method": 2, "payload": 3, "timeout_nano": 4, "metadata": 5},
    ttrpc_pb2.Response: {"status": 1, "payload": 2},
    ttrpc_pb2.KeyValue: {"key": 1, "value": 2},
}


@pytest.mark.parametrize("cls", UPSTREAM_FIELDS, ids=lambda c: c.DESCRIPTOR.name)
def test_field_numbers(cls):
    assert {f.name: f.number for f in cls.DESCRIPTOR.fields} == UPSTREAM_FIELDS[cls]


def test_status_has_google_rpc_status_numbers():
    status = ttrpc_pb2.Response.DESCRIPTOR.fields_by_name["status"].message_type
    assert {f.name: f.number for f in status.fields} == {"code": 1, "message": 2, "details": 3}


def test_services_and_events():
    plugin = nri_pb2.DESCRIPTOR.services_by_name["Plugin"]
    assert plugin.full_name == "nri.pkg.api.v1alpha1.Plugin"
    assert [m.name for m in plugin.methods] == [
        "Configure",
        "Synchronize",
        "Shutdown",
        "RunPodSandbox",
        "UpdatePodSandbox",
        "PostUpdatePodSandbox",
        "StopPodSandbox",
        "RemovePodSandbox",
        "CreateContainer",
        "PostCreateContainer",
        "StartContainer",
        "PostStartContainer",
        "UpdateContainer",
        "PostUpdateContainer",
        "StopContainer",
        "RemoveContainer",
        "StateChange",
        "ValidateContainerAdjustment",
    ]
    runtime = nri_pb2.DESCRIPTOR.services_by_name["Runtime"]
    assert [m.name for m in runtime.methods] == ["RegisterPlugin", "UpdateContainers"]
    assert [(v.name, v.number) for v in nri_pb2.Event.DESCRIPTOR.values][:4] == [
        ("UNKNOWN", 0),
        ("RUN_POD_SANDBOX", 1),
        ("STOP_POD_SANDBOX", 2),
        ("REMOVE_POD_SANDBOX", 3),
    ]
    assert nri_pb2.LAST == 15 and nri_pb2.VALIDATE_CONTAINER_ADJUSTMENT == 14


def unknown(msg) -> list[tuple[int, object]]:
    return [(f.field_number, f.data) for f in unknown_fields.UnknownFieldSet(msg)]


def test_fields_left_out_survive_a_round_trip():
    # LinuxPodSandbox.pod_overhead (field 1) and Container.image (field 22) exist upstream,
    # not here. Hand-encoded: tag, length, body.
    linux = b"\x0a\x03\x0a\x01\x01" + b"\x1a\x02cg"  # pod_overhead{...}, cgroup_parent="cg"
    pod = nri_pb2.PodSandbox.FromString(b"\x0a\x02id" + b"\x42" + bytes([len(linux)]) + linux)
    assert (pod.id, pod.linux.cgroup_parent) == ("id", "cg")
    container = nri_pb2.Container.FromString(b"\x0a\x01c" + b"\xb2\x01\x03\x0a\x01x")
    assert container.id == "c"
    req = nri_pb2.SynchronizeRequest(pods=[pod], containers=[container])
    again = nri_pb2.SynchronizeRequest.FromString(req.SerializeToString())
    assert unknown(again.pods[0].linux) == [(1, b"\x0a\x01\x01")]
    assert unknown(again.containers[0]) == [(22, b"\x0a\x01x")]
    assert again == req


def pr295_network_class():
    """PodSandboxNetwork as a runtime that only knows PR #295 sees it (ips = 1 only)."""
    pool = descriptor_pool.DescriptorPool()
    fdp = descriptor_pb2.FileDescriptorProto(name="pr295.proto", package="pr295", syntax="proto3")
    msg = fdp.message_type.add(name="PodSandboxNetwork")
    msg.field.add(
        name="ips",
        number=1,
        type=descriptor_pb2.FieldDescriptorProto.TYPE_STRING,
        label=descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED,
    )
    pool.Add(fdp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("pr295.PodSandboxNetwork"))


def test_extension_is_invisible_to_a_pr295_runtime():
    ours = nri_pb2.PodSandboxNetwork(
        ips=["10.244.1.2"],
        interfaces=[nri_pb2.NetworkInterface(name="eth0", mtu=1450)],
        routes=[nri_pb2.NetworkRoute(dst="0.0.0.0/0")],
        dns=nri_pb2.NetworkDNS(nameservers=["10.244.0.10"]),
    )
    theirs = pr295_network_class().FromString(ours.SerializeToString())
    assert list(theirs.ips) == ["10.244.1.2"]
    # and what they pass on still carries our fields
    assert nri_pb2.PodSandboxNetwork.FromString(theirs.SerializeToString()) == ours


GOOGLEAPIS_STATUS = """\
syntax = "proto3";
package google.rpc;
import "google/protobuf/any.proto";
option cc_enable_arenas = true;
option go_package = "google.golang.org/genproto/googleapis/rpc/status;status";
option java_multiple_files = true;
option java_outer_classname = "StatusProto";
option java_package = "com.google.rpc";
option objc_class_prefix = "RPC";
message Status {
  int32 code = 1;
  string message = 2;
  repeated google.protobuf.Any details = 3;
}
"""

COEXIST = """\
import importlib.util, sys
def load_googleapis():
    spec = importlib.util.spec_from_file_location("status_pb2", sys.argv[1])
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
if sys.argv[2] == "ours-first":
    from nri_cni.api import ttrpc_pb2
    import grpc
    g = load_googleapis()
else:
    import grpc
    g = load_googleapis()
    from nri_cni.api import ttrpc_pb2
wire = g.Status(code=12, message="nope").SerializeToString()
ours = ttrpc_pb2.Response.FromString(b"\\x0a" + bytes([len(wire)]) + wire)
assert (ours.status.code, ours.status.message) == (12, "nope"), ours
print("ok", g.Status.DESCRIPTOR.full_name, ours.status.DESCRIPTOR.full_name)
"""


@pytest.mark.parametrize("order", ["ours-first", "googleapis-first"])
def test_status_coexists_with_googleapis_and_grpcio(tmp_path, order):
    from importlib import resources

    from grpc_tools import protoc

    (tmp_path / "google" / "rpc").mkdir(parents=True)
    (tmp_path / "google" / "rpc" / "status.proto").write_text(GOOGLEAPIS_STATUS)
    include = resources.files("grpc_tools") / "_proto"
    assert (
        protoc.main(
            [
                "protoc",
                f"-I{tmp_path}",
                f"-I{include}",
                f"--python_out={tmp_path}",
                str(tmp_path / "google" / "rpc" / "status.proto"),
            ]
        )
        == 0
    )
    script = tmp_path / "coexist.py"
    script.write_text(COEXIST)
    proc = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "google" / "rpc" / "status_pb2.py"), order],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert "ok google.rpc.Status nri_cni.rpc.Status" in proc.stdout
