"""One stop + remove is one `"op":"del"` record: NRI StopPodSandbox, the runtime's
CNI DEL through the shim and NRI RemovePodSandbox all reach nri-cni; only the first finds
something to detach, and only it is logged."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest

from nri_cni.local import proto as localproto
from tests.support.harness import DaemonHarness, new_pod_id, pod_message, run

pytestmark = pytest.mark.netns


def test_stop_shim_del_and_remove_write_one_del_record(node, caplog):
    ns = node.jan.netns()
    nets = [{"name": "podnet", "default": True, "conflist": node.bridge_net("podnet", "10.244.39.0/24")}]
    cfg = node.config("native", nets)
    pod = pod_message(new_pod_id(), ns.path, name="web", namespace="default")
    shim_del = {
        "CNI_COMMAND": "DEL",
        "CNI_CONTAINERID": pod.id,
        "CNI_NETNS": ns.path,
        "CNI_IFNAME": "eth0",
        "CNI_ARGS": "K8S_POD_NAMESPACE=default;K8S_POD_NAME=web",
    }
    conf = json.dumps({"cniVersion": "1.0.0", "name": "nri-cni", "type": "nri-cni-shim"}).encode()

    async def scenario():
        async with DaemonHarness(node, cfg) as h:
            await h.runtime.run_pod_sandbox(pod)
            with caplog.at_level(logging.INFO, logger="nri_cni.podop"):
                await h.runtime.stop_pod_sandbox(pod)
                status, _ = await asyncio.to_thread(localproto.call, cfg["daemon"]["socket"], shim_del, conf)
                assert status == 0
                await h.runtime.remove_pod_sandbox(pod)

    run(scenario())
    records = [json.loads(r.getMessage()) for r in caplog.records if r.name == "nri_cni.podop"]
    dels = [r for r in records if r["op"] == "del"]
    assert len(dels) == 1, dels
    assert [(n["network"], n["op"]) for n in dels[0]["networks"]] == [("podnet", "del")]
    assert dels[0]["result"] == "ok"
