"""The pieces the containerd tests stand on, checked on their own: the pause program and its
OCI archive, the CRI proto preprocessing, the TOML writer, and the shipped containerd
config fragments (every key must be one containerd 2.x knows)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import signal
import subprocess
import tarfile
import time
import tomllib
from pathlib import Path

import pytest

from tests.support import toml_write
from tests.support.containerd import CONFIG_DIR, FRAGMENTS, bin_dir, load_fragments
from tests.support.cri import preprocess_proto
from tests.support.pause.image import build_pause_image


def _archive_members(archive: Path) -> dict[str, bytes]:
    with tarfile.open(archive) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def _blob(members: dict[str, bytes], digest: str) -> bytes:
    data = members["blobs/sha256/" + digest.removeprefix("sha256:")]
    assert "sha256:" + hashlib.sha256(data).hexdigest() == digest
    return data


def test_pause_archive_is_a_valid_oci_layout(tmp_path):
    image = build_pause_image()
    members = _archive_members(image.archive)
    assert json.loads(members["oci-layout"]) == {"imageLayoutVersion": "1.0.0"}
    index = json.loads(members["index.json"])
    [desc] = index["manifests"]
    assert desc["annotations"]["org.opencontainers.image.ref.name"] == image.ref
    assert desc["digest"] == image.manifest_digest
    manifest = json.loads(_blob(members, desc["digest"]))
    assert manifest["config"]["digest"] == image.config_digest
    config = json.loads(_blob(members, manifest["config"]["digest"]))
    [layer_desc] = manifest["layers"]
    layer = _blob(members, layer_desc["digest"])
    assert layer_desc["size"] == len(layer)
    # uncompressed layer: diff_id == digest
    assert config["rootfs"] == {"type": "layers", "diff_ids": [layer_desc["digest"]]}
    assert config["config"]["Entrypoint"] == ["/pause"]
    with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
        [member] = tar.getmembers()
        assert member.name == "pause" and member.mode & 0o111
        binary = tar.extractfile(member).read()
    assert binary[:4] == b"\x7fELF"
    exe = tmp_path / "pause"
    exe.write_bytes(binary)
    exe.chmod(0o755)
    # static: no program interpreter (the layer holds nothing else)
    proc = subprocess.run(["readelf", "-l", str(exe)], capture_output=True, text=True)
    assert proc.returncode == 0 and "INTERP" not in proc.stdout


def _zombie_children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, IndexError):
            continue
        if fields[0] == "Z" and int(fields[1]) == pid:
            found.append(int(entry))
    return found


def _children(parent: int) -> list[str]:
    """The parent's children, zombies included (a zombie stays its parent's until reaped)."""
    try:
        return Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
    except FileNotFoundError:
        return []


def _pid_in_children(parent: int, timeout: float = 60.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        kids = _children(parent)
        if kids:
            return int(kids[0])
        time.sleep(0.01)
    raise AssertionError(f"no child of {parent}")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_pause_reaps_orphans_and_exits_on_signal(tmp_path, sig):
    image = build_pause_image()
    members = _archive_members(image.archive)
    manifest = json.loads(members["blobs/sha256/" + image.manifest_digest.split(":")[1]])
    layer = members["blobs/sha256/" + manifest["layers"][0]["digest"].split(":")[1]]
    with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
        binary = tar.extractfile("pause").read()
    exe = tmp_path / "pause"
    exe.write_bytes(binary)
    exe.chmod(0o755)
    # pause as pid 1 of a new pid namespace, as in a pod
    outer = subprocess.Popen(["unshare", "--pid", "--kill-child", str(exe)])
    try:
        pause_pid = _pid_in_children(outer.pid)
        # an orphan inside its pid namespace is re-parented to pause, which must reap it
        subprocess.run(
            ["nsenter", f"--target={pause_pid}", "--pid", "--", "sh", "-c", "(sleep 0.2 &) ; exit 0"],
            check=True,
            timeout=10,
        )
        # the orphan is pause's child by now (its parent shell has exited): once it exits, pause
        # must reap it; unreaped, it stays pause's child (a zombie) and the wait runs out
        deadline = time.monotonic() + 60
        while _children(pause_pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _zombie_children(pause_pid) == [] and _children(pause_pid) == []
        assert outer.poll() is None  # still running until signalled
        os.kill(pause_pid, sig)
        assert outer.wait(5) == 0
    finally:
        if outer.poll() is None:
            outer.kill()
            outer.wait()


def test_preprocess_drops_gogo():
    text = """syntax = "proto3";
package runtime.v1;
import "github.com/gogo/protobuf/gogoproto/gogo.proto";
option (gogoproto.goproto_stringer_all) = false;
option go_package = "k8s.io/cri-api/pkg/apis/runtime/v1";
message A {
    string id = 1 [(gogoproto.customname) = "ID", (gogoproto.nullable) = false];
    int64 n = 2;
}
"""
    out = preprocess_proto(text)
    assert "gogo" not in out
    assert 'option go_package = "k8s.io/cri-api/pkg/apis/runtime/v1";' in out
    assert "string id = 1;" in out and "int64 n = 2;" in out


def test_toml_writer_round_trips():
    doc = {
        "version": 3,
        "root": "/x y",
        "plugins": {
            "io.containerd.nri.v1.nri": {
                "disable": False,
                "socket_path": 'a"b\\c',
                "plugin_request_timeout": "10s",
            },
            "io.containerd.cri.v1.runtime": {
                "cni": {"bin_dirs": ["/a", "/b"], "max_conf_num": 1},
                "containerd": {"runtimes": {"runc": {"options": {"SystemdCgroup": False}}}},
            },
            "empty": {},
        },
        "ratio": 0.5,
    }
    assert tomllib.loads(toml_write.dumps(doc)) == doc


def _key_paths(doc: dict, prefix: tuple = ()) -> list[tuple]:
    paths = []
    for k, v in doc.items():
        if isinstance(v, dict):
            paths += _key_paths(v, prefix + (k,))
        else:
            paths.append(prefix + (k,))
    return paths


@pytest.mark.e2e
def test_config_fragments_use_keys_containerd_knows():
    proc = subprocess.run(
        [str(bin_dir() / "containerd"), "config", "default"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    default = tomllib.loads(proc.stdout)
    for name in FRAGMENTS:
        with open(CONFIG_DIR / name, "rb") as f:
            fragment = tomllib.load(f)
        assert fragment["version"] == default["version"] == 3
        for path in _key_paths(fragment):
            node = default
            for part in path:
                assert isinstance(node, dict) and part in node, f"{name}: {'.'.join(path)}"
                node = node[part]
            assert type(node) is type(_get(fragment, path)), f"{name}: {'.'.join(path)}"
    merged = load_fragments()
    nri = merged["plugins"]["io.containerd.nri.v1.nri"]
    assert nri["disable"] is False and nri["plugin_request_timeout"] == "10s"
    assert merged["plugins"]["io.containerd.cri.v1.runtime"]["restrict_oom_score_adj"] is True


def _get(doc: dict, path: tuple):
    for part in path:
        doc = doc[part]
    return doc
