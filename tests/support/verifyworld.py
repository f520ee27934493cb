"""The verify tests' world without root: one pod attached through the pod service, its plugin
the fake executor's (its ADD answers one IP; `add_answer` replaces that answer when set), the
node read by a fake inspector. Used by tests/unit/service/test_verify_*.py and
tests/repo/test_verify_walk.py; each names its own pod (`tag`) and address."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from nri_cni.cni.cache import CacheEntry
from nri_cni.cni.exec_errors import Ended
from nri_cni.cni.executor import FakeExecutor
from nri_cni.cni.runtime import CNIRuntime
from nri_cni.config import parse_config
from nri_cni.node import Difference, Expectation, Finding, FindingKind
from nri_cni.pod.model import PodInfo
from nri_cni.service.modes import mode_for
from tests.support.pods import pod_plan, pod_service


class Inspector:
    """NodeInspector's answers, one an inspect call from `answers` ("damaged": every
    attachment's link missing; "unreadable": the host side could not be read; "ok"), then every
    attachment as expected. `on_inspect` runs inside the next call (while the round reads);
    `asked`: the pod of each expectation it was asked about."""

    def __init__(self, *answers: str) -> None:
        self.answers = list(answers)
        self.on_inspect: Callable[[], Awaitable[None]] | None = None
        self.asked: list[str] = []

    async def inspect(self, exps: Sequence[Expectation]) -> list[Finding]:
        self.asked += [e.key.split("/")[0] for e in exps]
        if self.on_inspect is not None:
            hook, self.on_inspect = self.on_inspect, None
            await hook()
        answer = self.answers.pop(0) if self.answers else "ok"
        if answer == "damaged":
            return [Finding(e, (Difference(FindingKind.LINK_MISSING, "no eth0"),)) for e in exps]
        if answer == "unreadable":
            return [
                Finding(e, (Difference(FindingKind.UNREADABLE, "cannot read host links: EIO"),)) for e in exps
            ]
        return [Finding(e) for e in exps]

    def close(self) -> None:
        pass


class World:
    """Pod `tag * 32` on network "podnet" (plugin type `<tag>-br`, with the `ips` capability
    unless `plugin` says otherwise), shim mode, repair_on_sync off; `settings`: more of the
    config's keys (e.g. "repair", "mode")."""

    def __init__(
        self,
        tmp: Path,
        *,
        tag: str,
        ip: str,
        inspector: Inspector | None = None,
        plugin: dict | None = None,
        verify: dict | None = None,
        settings: dict | None = None,
    ) -> None:
        self.ip = ip
        self.add_answer: Ended | None = None
        self.fake = FakeExecutor({f"{tag}-br": {"ADD": self._add}})
        plugin = {"type": f"{tag}-br", "capabilities": {"ips": True}} if plugin is None else plugin
        self.conflist = {"cniVersion": "1.1.0", "name": "podnet", "plugins": [plugin]}
        doc: dict[str, Any] = {
            "mode": "shim",
            "state_dir": str(tmp / "state"),
            "networks": [{"name": "podnet", "default": True, "conflist": self.conflist}],
            "repair_on_sync": False,
            **({"verify": verify} if verify is not None else {}),
            **(settings or {}),
        }
        cfg = parse_config(doc, str(tmp / "config.yaml"))
        self.inspector = Inspector() if inspector is None else inspector
        self.plan = pod_plan(cfg, CNIRuntime(["/fake-bin"], str(tmp / "cache"), executor=self.fake))
        self.svc = pod_service(
            cfg, self.plan, mode=mode_for(cfg), inspector=self.inspector, pod_inspector=self.inspector
        )  # type: ignore[arg-type]
        netns = tmp / "netns"
        netns.write_text("")  # a path that exists; what it holds is the fake inspector's answer
        self.pod = PodInfo(tag * 32, name=f"{tag}-pod", namespace="default", netns=str(netns), ips=(ip,))

    def _add(self, call: Any) -> Ended | bytes:
        if self.add_answer is not None:
            return self.add_answer
        result = {
            "cniVersion": "1.1.0",
            "interfaces": [{"name": "eth0", "sandbox": call.env["CNI_NETNS"], "mac": "02:00:00:00:0e:01"}],
            "ips": [{"address": f"{self.ip}/24", "interface": 0}],
        }
        return json.dumps(result).encode()

    async def attached_and_listed(self) -> None:
        await self.svc.verbs.attach(self.pod)
        self.svc.roster.listed([self.pod])  # the runtime's list has it, with eth0's IP

    def other_pod_holds(self, pod_id: str, address: str) -> None:
        """Another pod's attachment whose result holds `address` (the cache is what says so)."""
        result = {"cniVersion": "1.1.0", "ips": [{"address": f"{address}/24", "interface": 0}]}
        config = json.dumps({**self.conflist, "name": "othernet"}).encode()
        self.plan.cni.cache.write(CacheEntry(pod_id, "eth0", "othernet", config, "/x", result=result))

    def adds(self) -> int:
        return self.fake.commands().count("ADD")

    def run(self, scenario: Callable[[], Awaitable[Any]]) -> Any:
        """`scenario` in a new event loop; the service closed after it, whatever happened."""

        async def whole() -> Any:
            try:
                return await scenario()
            finally:
                await self.svc.close()

        return asyncio.run(whole())
