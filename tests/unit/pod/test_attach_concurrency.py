"""A pod's networks are ADDed at once, each chain in its order, FINALIZE after all of them
(limits.parallel_per_pod at most together; 1: one after another); a network that fails rolls
back every one started, also those that were still running when it failed. Real plugin
processes (tests/plugins/span_plugin.py records each call's start and end; its `hold` keeps an
ADD running until the test releases it); no root, no wall clock."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from nri_cni.cni.exec import PluginExecutor
from nri_cni.cni.runtime import CNIRuntime
from nri_cni.config import parse_config
from nri_cni.errors import PodError
from nri_cni.pod.model import PodInfo
from nri_cni.service.modes import mode_for
from tests.support.bin_dir import install_test_plugin
from tests.support.pods import pod_plan, pod_service

NETS = ("neta", "netb", "netc")


class World:
    def __init__(self, tmp: Path, *, per_pod: int, failing: str = "") -> None:
        self.tmp = tmp
        self.log = tmp / "spans.log"
        self.fake_log = tmp / "fake.log"
        self.hold = tmp / "hold"
        self.hold.mkdir()
        bin_dir = tmp / "bin"
        bin_dir.mkdir()
        install_test_plugin(bin_dir, "span_plugin", "span")
        install_test_plugin(bin_dir, "fake_plugin", "fake")
        (tmp / "_finalize.d").mkdir()
        span = {"type": "span", "log": str(self.log)}
        held = {**span, "hold": {"dir": str(self.hold), "commands": ["ADD"], "timeout": 60}}
        networks = []
        for n, name in enumerate(NETS):
            plugins = [held, span]
            if name == failing:  # fails at once, while the others are held in their ADD
                plugins = [
                    {
                        "type": "fake",
                        "log": str(self.fake_log),
                        "fake": {"ADD": {"error": {"code": 100, "msg": "no room"}}},
                    }
                ]
            networks.append(
                {
                    "name": name,
                    "default": True,
                    "interface": "eth0" if n == 0 else f"net{n}",
                    "conflist": {
                        "cniVersion": "1.1.0",
                        "name": name,
                        "plugins": plugins,
                        "finalize_plugins": [span],
                    },
                }
            )
        doc = {
            "mode": "shim",
            "state_dir": str(tmp / "state"),
            "nri": {"socket": str(tmp / "nri.sock")},
            "daemon": {"socket": str(tmp / "daemon.sock")},
            "cni": {
                "bin_dirs": [str(bin_dir)],
                "cache_dir": str(tmp / "cache"),
                "finalize_dir": str(tmp / "_finalize.d"),
            },
            "networks": networks,
            "limits": {"parallel_per_pod": per_pod},
            "gc": {"interval": 0},
            "status": {"interval": 0},
            "files": {"trust": "warn"},  # the test's tmp dir, whoever runs it
        }
        cfg = parse_config(doc, str(tmp / "config.yaml"))
        cni = CNIRuntime(
            list(cfg.cni.bin_dirs), cfg.cni.cache_dir, executor=PluginExecutor(trust_files=cfg.trust_files)
        )
        self.service = pod_service(cfg, pod_plan(cfg, cni), mode=mode_for(cfg))
        netns = tmp / "netns"
        netns.touch()  # a file standing for the netns: the span plugin never enters it
        self.pod = PodInfo("p" * 64, name="three", namespace="default", netns=str(netns))

    def events(self) -> list[dict]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]

    def running(self, command: str) -> set[str]:
        """The interfaces whose `command` call has started and not ended."""
        now: set[str] = set()
        for e in self.events():
            if e["command"] == command:
                (now.add if e["phase"] == "start" else now.discard)(e["ifname"])
        return now

    def release(self) -> None:
        (self.hold / "release").touch()


async def _until(check, what: str) -> None:
    """Waits for something the test caused (a guard against hanging, never a measurement)."""
    for _ in range(6000):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never happened: {what}")


def _most_at_once(events: list[dict], command: str) -> int:
    now = most = 0
    for e in events:
        if e["command"] == command:
            now += 1 if e["phase"] == "start" else -1
            most = max(most, now)
    return most


def _overlapping_calls_of_one_attachment(events: list[dict]) -> list[str]:
    running: dict[str, str] = {}
    found = []
    for e in events:
        key, call = e["ifname"], f"{e['command']}/{e['ifname']}"
        if e["phase"] == "start":
            if key in running:
                found.append(f"{call} started while {running[key]} ran")
            running[key] = call
        else:
            running.pop(key, None)
    return found


@pytest.mark.parametrize("per_pod", [3, 2, 1])
def test_networks_are_added_at_once_within_the_limit_and_finalized_after_all(tmp_path, caplog, per_pod):
    caplog.set_level("INFO", logger="nri_cni.podop")
    w = World(tmp_path, per_pod=per_pod)

    async def scenario():
        attach = asyncio.create_task(w.service.verbs.attach(w.pod))
        # `per_pod` ADDs are held at once: they were started together, none waited for another
        await _until(lambda: len(w.running("ADD")) == per_pod, f"{per_pod} ADDs running together")
        w.release()
        answer = await attach
        assert [a.ifname for a in answer.attachments] == ["eth0", "net1", "net2"]  # the pod's order
        events = w.events()
        assert _most_at_once(events, "ADD") == per_pod  # together, and never more than the limit
        assert _overlapping_calls_of_one_attachment(events) == []  # each chain in its order
        last_add_end = max(i for i, e in enumerate(events) if e["command"] == "ADD")
        finalizes = [i for i, e in enumerate(events) if e["command"] == "FINALIZE"]
        assert len(finalizes) == 6 and min(finalizes) > last_add_end  # FINALIZE after every ADD
        (record,) = [json.loads(r.getMessage()) for r in caplog.records if r.name == "nri_cni.podop"]
        adds = [s for s in record["networks"] if s["op"] == "add"]
        assert sorted(s["ifname"] for s in adds) == ["eth0", "net1", "net2"]
        assert all("at" in s and "ms" in s for s in adds)  # the record shows when each ran
        await w.service.verbs.detach(w.pod)
        await w.service.close()
        assert w.service.view.attachments() == []

    asyncio.run(scenario())


def test_a_failing_network_rolls_back_every_network_started_even_those_still_running(tmp_path, caplog):
    caplog.set_level("INFO", logger="nri_cni.podop")
    w = World(tmp_path, per_pod=3, failing="netb")

    async def scenario():
        attach = asyncio.create_task(w.service.verbs.attach(w.pod))
        await _until(lambda: w.running("ADD") == {"eth0", "net2"} and w.fake_log.exists(), "netb failed")
        assert not attach.done()  # the failure waits for the ADDs still running: none is cut
        w.release()
        with pytest.raises(PodError) as err:
            await attach
        assert "netb" in str(err.value) or "netb" in str(err.value.cause)
        events = w.events()
        dels = sorted(e["ifname"] for e in events if e["command"] == "DEL" and e["phase"] == "end")
        assert dels == ["eth0", "eth0", "net2", "net2"]  # both plugins of each chain, DELed
        assert [e for e in events if e["command"] == "FINALIZE"] == []
        fake_calls = [json.loads(line)["command"] for line in w.fake_log.read_text().splitlines()]
        assert fake_calls == ["ADD", "DEL"]  # the failed network gets its DEL too
        assert _overlapping_calls_of_one_attachment(events) == []
        assert w.service.view.attachments() == [] and w.service.plan.intent_pod_ids() == []
        await w.service.close()

    asyncio.run(scenario())
