"""nri-cni run the way node software runs it, against real containerd: systemd's notify protocol
(READY only once registered and synchronized) and the pre-registered launch (containerd starts
the linked executable from its plugin_path with the connection on fd 3)."""

from __future__ import annotations

import socket
import sys
import time
import uuid

import pytest
import yaml

from tests.support.bin_dir import install_plugin
from tests.support.conflists import bridge_conflist, host_local, network
from tests.support.hostlocal import host_local_reservations
from tests.support.janitor import Janitor
from tests.support.names import unique_name
from tests.support.nricni import NriCni, ShimSetup

pytestmark = pytest.mark.e2e


@pytest.fixture
def shim_env(tmp_path):
    jan = Janitor()
    setup = ShimSetup(tmp_path)
    bridge = unique_name("br")
    jan.track_link(bridge)
    nets = [network(bridge_conflist("podnet", bridge, host_local(setup.ipam_dir, "10.246.50.0/24")))]
    yield setup, nets
    errors = jan.cleanup()
    setup.cleanup()
    assert not errors


def test_ready_is_notified_only_after_registration(shim_env, make_containerd, tmp_path):
    setup, nets = shim_env
    ctd = make_containerd(cni_conf_dir=setup.conf_dir, cni_bin_dirs=[setup.bin_dir], start=False)
    notify_path = str(setup.sock_dir / "notify")
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(notify_path)
    daemon = NriCni(tmp_path, setup.config(ctd.nri_socket, nets))
    try:
        daemon.start(wait_registered=False, env={"NOTIFY_SOCKET": notify_path})
        # The daemon serves its local socket but has no runtime yet: once it has tried to reach
        # one (and logged that it failed), no READY is waiting.
        while "NRI runtime not reachable" not in daemon.log_path.read_text():
            time.sleep(0.05)  # (a hang: pytest's timeout)
        notify.setblocking(False)
        with pytest.raises(BlockingIOError):
            notify.recv(4096)
        assert daemon.status()["nri"]["registered"] is False
        ctd.start()
        notify.settimeout(60)  # a hang guard
        message = notify.recv(4096).decode()
        assert "READY=1" in message.split("\n")
        st = daemon.status()
        assert st["nri"]["registered"] and st["nri"]["synchronized"]
        assert st["nri"]["runtime"].startswith("containerd 2.")
        log = daemon.log_path.read_text()
        assert "registered with the NRI runtime" in log and "synchronized:" in log
    finally:
        daemon.stop()
        notify.close()


LAUNCHER = """#!/bin/sh
# What a node admin links into /opt/nri/plugins as 10-cni (see systemd/10-cni).
exec {python} -m nri_cni.cli run --config {config}
"""


def test_preregistered_launch_gives_pods_networks(shim_env, make_containerd, tmp_path):
    setup, nets = shim_env
    plugin_dir = tmp_path / "nri-plugins"
    plugin_dir.mkdir()
    ctd = make_containerd(
        cni_conf_dir=setup.conf_dir, cni_bin_dirs=[setup.bin_dir], nri_plugin_path=plugin_dir, start=False
    )
    cfg = setup.config(ctd.nri_socket, nets)
    config_path = tmp_path / "nri-cni.yaml"
    config_path.write_text(yaml.safe_dump(cfg))
    install_plugin(plugin_dir, "10-cni", LAUNCHER.format(python=sys.executable, config=config_path))
    daemon = NriCni(tmp_path, cfg)  # only to talk to the daemon containerd launched
    ctd.start()
    deadline = time.monotonic() + 60
    while True:
        try:
            st = daemon.status()
            if st["nri"]["synchronized"]:
                break
        except Exception:
            pass
        assert time.monotonic() < deadline, ctd.log_tail()
        time.sleep(0.05)
    assert st["nri"]["runtime"].startswith("containerd")
    pod = ctd.cri.run_pod(f"pre-{uuid.uuid4().hex[:6]}", "nct-e2e", str(uuid.uuid4()))
    ip = ctd.cri.pod_status(pod).ip
    pods = daemon.pods()
    assert [(p["id"], p["network-status"][0]["ips"]) for p in pods] == [(pod, [ip])]
    ctd.cri.stop_pod(pod)
    ctd.cri.remove_pod(pod)
    assert host_local_reservations(setup.ipam_dir) == []
    assert daemon.pods() == []
    # containerd owns the launched plugin: stopping containerd closes fd 3 and nri-cni exits.
    ctd.stop()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            daemon.status()
        except Exception:
            break
        time.sleep(0.1)
    else:
        pytest.fail("the pre-registered nri-cni kept running after containerd stopped")
