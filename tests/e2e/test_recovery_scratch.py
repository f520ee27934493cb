import json, os, time, uuid, subprocess
import pytest
from tests.e2e.nricni import NriCni, ShimSetup
from tests.support.netns import Janitor, host_local_reservations, unique_name

pytestmark = pytest.mark.e2e

def test_explore(tmp_path, make_containerd):
    jan = Janitor()
    setup = ShimSetup(tmp_path)
    br = unique_name("br"); jan.track_link(br)
    nets = [{"name": "podnet", "default": True, "conflist": {
                "cniVersion": "1.1.0", "name": "podnet", "plugins": [
                    {"type": "bridge", "bridge": br, "isGateway": True, "ipMasq": True,
                     "ipam": {"type": "host-local", "dataDir": str(setup.ipam_dir),
                              "ranges": [[{"subnet": "10.246.100.0/24"}]]}},
                    {"type": "portmap", "capabilities": {"portMappings": True}}]}}]
    ctd = make_containerd(cni_conf_dir=setup.conf_dir, cni_bin_dirs=[setup.bin_dir])
    t0=time.monotonic()
    cfg = setup.config(ctd.nri_socket, nets)
    d = NriCni(tmp_path, cfg)
    d.start(env={"NRI_CNI_CRASH_AT": "ADD:podnet:1:before"})
    print("daemon start", time.monotonic()-t0)
    try:
        t0=time.monotonic()
        try:
            ctd.cri.run_pod("crash-1", "nct-e2e", str(uuid.uuid4()), port_mappings=[{"protocol":"tcp","container_port":80,"host_port":18080}])
        except Exception as e:
            print("run failed", str(e)[:300], time.monotonic()-t0)
        print("daemon rc", d.proc.poll())
        print("reservations", host_local_reservations(setup.ipam_dir))
        print("intents", os.listdir(setup.state_dir/"intents"))
        for p in ctd.cri.list_pods():
            st = ctd.cri.pod_status(p.id)
            print("pod", p.id[:12], p.state, st.netns_path, st.netns_path and os.path.exists(st.netns_path))
        print(subprocess.run("ls /var/run/netns", shell=True, capture_output=True, text=True).stdout)
        t0=time.monotonic()
        d.start()
        print("restart", time.monotonic()-t0)
        d.wait_idle()
        print("reservations", host_local_reservations(setup.ipam_dir))
        print(d.log_tail(30))
        for p in ctd.cri.list_pods():
            print("pod", p.id[:12], p.state)
            ctd.cri.stop_pod(p.id); ctd.cri.remove_pod(p.id)
        print(ctd.log_tail(40))
    finally:
        d.stop()
        print(jan.cleanup()); setup.cleanup()
