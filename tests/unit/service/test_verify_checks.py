"""A verify round's CHECKs of pods netlink found intact: the round is done (every pod has its
verdict from netlink, `nri-cni status` says verified) before they run; they run a few at once,
never more than verify.check_parallel()."""

from __future__ import annotations

import asyncio

from nri_cni.cni.cache import CacheEntry
from nri_cni.service.verify import check_parallel
from tests.support.unstarted import RESULT, FakeInspector, daemon_for, verify_pod


def test_the_round_is_done_before_its_checks_which_run_a_few_at_once(tmp_path):
    daemon = daemon_for(tmp_path, verify={"check_every": 1})  # every attachment CHECKed each round
    netns = tmp_path / "netns"
    netns.write_text("")  # a path that exists: the fake inspector answers for it
    pods = [verify_pod(n, netns) for n in range(1, 9)]
    svc = daemon.pods
    for n, pod in enumerate(pods, start=1):
        result = {**RESULT, "ips": [{"address": f"10.9.0.{n}/24", "interface": 0}]}
        entry = CacheEntry(
            pod.id, "eth0", "podnet", b"{}", netns=pod.netns, cni_args=pod.cni_args(), result=result
        )
        svc.plan.cni.cache.write(entry)
    svc.verifier._inspector = FakeInspector(set(), set())
    running, peak, seen = 0, 0, []

    async def check_entry(entry: CacheEntry, path: str) -> str:
        nonlocal running, peak
        health = svc.health.get(entry.container_id)
        seen.append((svc.health.rounds, health.state.value if health else None))
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.02)
        running -= 1
        return ""

    svc.plan.check_entry = check_entry  # what the round calls for each CHECK due

    async def scenario():
        svc.timers.synchronized(pods)
        await svc.close()  # that Synchronize's background GC: not this test's
        return await svc.timers.verify()

    verdicts = asyncio.run(scenario())
    assert sorted(h.pod_id for h in verdicts) == sorted(p.id for p in pods)
    assert {h.state.value for h in verdicts} == {"ok"}
    # each CHECK began after the round was done, the pod already judged by netlink
    assert seen == [(1, "ok")] * len(pods)
    assert 1 < peak <= check_parallel()
