"""Verify never calls a pod ok when something it needs cannot be read, without
root: the node inspector is a fake that answers what a real one answers when netlink fails (the
pod's netns, or the host's links), and the cache entries are real files. Each such pod is
reported by name, broken "unreadable", with the attachment's own verdict; nothing is repaired
on a guess, and a pod read fine next to them stays ok."""

from __future__ import annotations

import asyncio

from nri_cni.cni.cache import CacheEntry
from tests.support.unstarted import RESULT, FakeInspector, daemon_for, verify_pod


def test_what_cannot_be_read_is_reported_never_ok(tmp_path):
    # netlink only: no CHECK of a plugin that is not there
    daemon = daemon_for(tmp_path, verify={"check_every": 10000})
    netns = tmp_path / "netns"
    netns.write_text("")  # a path that exists: what it holds is the fake inspector's answer
    fine, bad_netns, bad_host, no_result, bad_result = (verify_pod(n, netns) for n in range(1, 6))
    svc = daemon.pods
    for pod in (fine, bad_netns, bad_host, no_result, bad_result):
        n = int(pod.ips[0].rsplit(".", 1)[1])
        result: dict | None = {**RESULT, "ips": [{"address": f"10.9.0.{n}/24", "interface": 0}]}
        if pod is no_result:
            result = None
        elif pod is bad_result:
            result = {**RESULT, "ips": [{"address": "10.9.0.5", "interface": 0}]}  # no prefix length
        svc.plan.cni.cache.write(
            CacheEntry(
                pod.id, "eth0", "podnet", b"{}", netns=pod.netns, cni_args=pod.cni_args(), result=result
            )
        )
    svc.verifier._inspector = FakeInspector({bad_netns.id}, {bad_host.id})

    async def scenario():
        svc.timers.synchronized([fine, bad_netns, bad_host, no_result, bad_result])
        await svc.close()  # that Synchronize's background GC: not this test's
        return await svc.timers.verify()

    verdicts = {h.pod_id: h for h in asyncio.run(scenario())}
    assert set(verdicts) == {p.id for p in (fine, bad_netns, bad_host, no_result, bad_result)}
    assert verdicts[fine.id].state.value == "ok"
    for pod, finding, words in (
        (bad_netns, "unreadable", "Permission denied"),
        (bad_host, "unreadable", "cannot read host links"),
        (no_result, "no-result", "holds no result"),
        (bad_result, "bad-result", "cannot be read"),
    ):
        h = verdicts[pod.id]
        assert (h.state.value, h.code.value if h.code else "") == ("broken", "unreadable"), pod.name
        assert words in h.reason and "nothing was changed" in h.reason
        assert [(a.network, a.ifname, a.finding) for a in h.attachments] == [("podnet", "eth0", finding)]
        assert h.repairs == 0
    named = {b["name"] for b in daemon.reports.status()["broken"]}
    assert named == {"ncver-2", "ncver-3", "ncver-4", "ncver-5"}
    # nothing was changed: every cache entry is still there, as written
    assert len(svc.view.attachments()) == 5
