"""What the pod verbs keep of a pod once its whole life went through them the way containerd
drives a shim-mode pod (NRI run seen, the shim's ADD, NRI stop, the shim's DEL, NRI remove,
the shim's DEL after it): nothing, however many pods. Without root: the plugins are the fake
executor's."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from nri_cni.cni.executor import FakeExecutor
from nri_cni.cni.runtime import CNIRuntime
from nri_cni.config import parse_config
from nri_cni.pod.model import PodInfo
from nri_cni.service.modes import mode_for
from tests.support.pods import pod_plan, pod_service

NET = {"cniVersion": "1.1.0", "name": "podnet", "plugins": [{"type": "k7-br"}]}
PODS = 20


def _result(call) -> bytes:
    return json.dumps(
        {
            "cniVersion": "1.1.0",
            "interfaces": [{"name": "eth0", "sandbox": call.env["CNI_NETNS"]}],
            "ips": [{"address": "10.77.0.2/24", "interface": 0}],
        }
    ).encode()


def _kept(svc) -> dict[str, int]:
    """Per-pod entries the service holds."""
    return {
        "roster": len(svc.roster.view()),
        "health": len(list(svc.health.all())),
        "fresh": len(svc.plan.oplog.fresh),
        "bare": len(svc.plan._bare),
        "locks": len(svc.locks),
    }


@pytest.mark.parametrize("listed", [True, False])
def test_a_pod_s_whole_life_leaves_nothing_behind(tmp_path: Path, listed: bool):
    """Control (`listed` False): before the runtime's first list, the DEL that comes after the
    remove is kept as a teardown (a list that has the pod makes it relisted), one per pod."""
    fake = FakeExecutor({"k7-br": {"ADD": _result}})
    doc = {
        "mode": "shim",
        "state_dir": str(tmp_path / "state"),
        "networks": [{"name": "podnet", "default": True, "conflist": NET}],
    }
    cfg = parse_config(doc, str(tmp_path / "config.yaml"))
    svc = pod_service(
        cfg,
        pod_plan(cfg, CNIRuntime(["/fake-bin"], str(tmp_path / "cache"), executor=fake)),
        mode=mode_for(cfg),
    )
    (tmp_path / "netns").write_text("")

    async def scenario() -> dict[str, int]:
        if listed:
            svc.timers.synchronized([])
            await svc.close()  # the background GC/verify of that Synchronize: not this test's
        for i in range(PODS):
            pod = PodInfo(f"{i:064x}", name=f"k7-{i}", namespace="default", netns=str(tmp_path / "netns"))
            svc.verbs.seen(pod)
            await svc.verbs.attach(pod)
            await svc.verbs.detach(pod, stop_event=True)
            await svc.verbs.detach(pod)
            await svc.verbs.remove(pod)
            await svc.verbs.detach(pod)
        kept = _kept(svc)
        await svc.close()
        return kept

    kept = asyncio.run(scenario())
    assert kept == {"roster": 0 if listed else PODS, "health": 0, "fresh": 0, "bare": 0, "locks": 0}
    assert fake.commands().count("ADD") == PODS  # every pod went through the plugins
