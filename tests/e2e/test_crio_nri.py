"""What real CRI-O 1.36 sends an NRI plugin, and that the NRI double's CRI-O mode
(tests/support/nri_runtime.py, CRIO) sends the same.

CRI-O runs its own CNI (the bridge network from conftest); the stub only records: the
handshake, then the pod events with the netns path each carries and whether it still existed.
"""

from __future__ import annotations

import uuid

import pytest

from nri_cni.api import nri_pb2
from tests.support.nri_runtime import CRIO, NriRuntime, stop_steps
from tests.support.stubthread import Recorder, StubThread, double_netns, observed_stop_steps

pytestmark = pytest.mark.e2e


def test_crio_stops_a_pod_as_the_double_crio_mode_does(bridge_network, make_crio):
    crio = make_crio(
        cni_conf_dir=bridge_network.conf_dir, default_network=bridge_network.name, nri_request_timeout="7s"
    )
    rec = Recorder()
    st = StubThread(rec, name="nctrec", idx="50", socket_path=crio.nri_socket).start()
    try:
        st.wait_synchronized()
        # Configure: the double's CRI-O values (the request timeout is the test's, set above)
        double = NriRuntime(None, kind=CRIO)
        assert rec.configures == [
            {
                "runtime_name": double.runtime_name,
                "runtime_version": double.runtime_version,
                "registration_timeout": double.registration_timeout_ms,
                "request_timeout": 7000,
            }
        ]

        uid = str(uuid.uuid4())
        pod = crio.cri.run_pod("web-0", "nct-nri", uid)
        status = crio.cri.pod_status(pod)
        # CRI-O waits for the plugin, so RUN is in before RunPodSandbox returns: its CNI ADD
        # has run (the IPs are filled in) and the netns exists
        [(kind, run)] = rec.events_for(pod)
        assert kind == "run"
        assert run.netns == status.netns_path and run.netns_exists
        assert status.ip in run.ips

        crio.cri.stop_pod(pod)
        crio.cri.remove_pod(pod)
        events = rec.events_for(pod)
        assert [k for k, _ in events] == ["run", "stop", "remove"]
        (_, stop), (_, remove) = events[1], events[2]
        # STOP still reports the path, but CRI-O's CNI DEL and netns removal came first: the
        # double's CRI-O mode runs the teardown before STOP
        assert stop.netns == status.netns_path and not stop.netns_exists
        assert stop_steps(CRIO) == observed_stop_steps(stop)
        # REMOVE carries the netns path the double's CRI-O mode gives it
        assert remove.netns == double_netns(CRIO, nri_pb2.REMOVE_POD_SANDBOX, status.netns_path)
        assert rec.disconnects == 0
    finally:
        st.stop()
