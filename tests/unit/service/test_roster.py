"""The runtime's list is the roster, without root, runtime or plugins: a
Synchronize (or a GC) that does not list a pod drops its verdict, its repair retry and its
roster record, and `nri-cni pods` shows it no more; a pod nri-cni still holds something of
shows as not listed. The reaper and GC keep a listed pod whose pause process runs, whatever
became of its netns path."""

from __future__ import annotations

import asyncio
import os

import pytest

from nri_cni.cni.cache import CacheEntry
from nri_cni.daemon.app import Daemon
from nri_cni.pod.model import PodInfo
from nri_cni.pod.upkeep import pause_alive
from nri_cni.service import verbs
from nri_cni.service.podcheck import Retry
from nri_cni.service.podstate import BrokenCode
from nri_cni.service.roster import Roster
from tests.support.unstarted import daemon_for

GONE, KEPT, HELD = "a" * 64, "b" * 64, "c" * 64


def _pod(pod_id: str, name: str, **kw) -> PodInfo:
    kw.setdefault("netns", f"/run/netns/ncver-{name}")
    return PodInfo(pod_id, name=name, namespace="ncver", **kw)


def _known(daemon: Daemon, pod_id: str) -> list[str]:
    """Where the daemon still keeps something of the pod."""
    svc = daemon.pods
    record = svc.roster.record(pod_id)
    places = {
        "health": svc.health.get(pod_id) is not None,
        "retries": pod_id in svc.verifier._retries,
        "roster.pod": record.pod is not None,
        "roster.attach_failed": record.attach_failed,
        "roster.stopped": record.stopped,
        "roster.late": bool(record.late),
        "report": any(p["id"] == pod_id for p in daemon.reports.pods()),
    }
    return sorted(k for k, v in places.items() if v)


def _everywhere(daemon: Daemon, pod: PodInfo) -> None:
    svc = daemon.pods
    svc.health.broken(pod.id, BrokenCode.REPAIR_FAILED, "ADD failed 3 times")
    svc.verifier._retries[pod.id] = Retry(failures=2)
    svc.roster.attach_failed(pod.id)
    svc.roster.stopped(pod.id)
    svc.roster.missed(pod.id, "answered past the deadline")


def test_a_synchronize_without_a_pod_forgets_it_everywhere(tmp_path):
    daemon = daemon_for(tmp_path)
    gone, kept = _pod(GONE, "gone"), _pod(KEPT, "kept")

    async def scenario():
        svc = daemon.pods
        svc.timers.synchronized([gone, kept])
        await svc.close()  # the background GC/verify of that Synchronize: not this test's
        _everywhere(daemon, gone)
        svc.health.ok(kept.id)
        assert _known(daemon, gone.id) == [
            "health",
            "report",
            "retries",
            "roster.attach_failed",
            "roster.late",
            "roster.pod",
            "roster.stopped",
        ]
        svc.timers.synchronized([kept])  # RemovePodSandbox of `gone` was lost with the connection
        await svc.close()
        assert _known(daemon, gone.id) == []
        assert _known(daemon, kept.id) == ["health", "report", "roster.pod"]
        assert [(p["id"], p["listed"]) for p in daemon.reports.pods()] == [(kept.id, True)]

    asyncio.run(scenario())


@pytest.mark.parametrize("netns", ["gone", "there"])
def test_a_gc_forgets_verdicts_of_pods_the_runtime_dropped_and_reports_what_it_holds(tmp_path, netns):
    """An attached pod the runtime does not list: while the netns path the runtime gave still
    exists it is held (valid within the grace: the control case), once that path is gone GC
    DELs it. Both paths lie in a directory of the test's own, so that `netns_gone` can tell,
    whatever the machine has under /run/netns."""
    daemon = daemon_for(tmp_path)
    (tmp_path / "netns").mkdir()
    if netns == "there":
        (tmp_path / "netns" / "held").write_text("")
    kept, held = _pod(KEPT, "kept"), _pod(HELD, "held", netns=str(tmp_path / "netns" / "held"))

    async def scenario():
        svc = daemon.pods
        svc.timers.synchronized([kept])
        await svc.close()
        # a verdict written between the list and its pod's removal event (which was lost)
        svc.roster.seen(held)
        svc.health.broken(held.id, BrokenCode.REPAIR_FAILED, "ADD failed 3 times")
        svc.roster.removed(held.id)
        # an attachment of a pod the runtime does not list (its cached netns exists)
        svc.plan.cni.cache.write(
            CacheEntry(
                container_id=held.id,
                ifname="eth0",
                network_name="podnet",
                config=b"{}",
                netns=str(tmp_path),
                cni_args=held.cni_args(),
            )
        )
        svc.roster.attached(held)  # not listed yet: valid while its netns path exists (roster.py)
        report = await svc.timers.gc("test")
        assert report["deleted"] == [], report
        health = svc.health.get(held.id)
        rows = {p["id"]: (p["state"], p["listed"], p["name"]) for p in daemon.reports.pods()}
        assert rows == {kept.id: ("ready", True, "kept"), held.id: ("unlisted", False, "held")}
        # its stale verdict (repair-failed) is gone either way
        if netns == "there":
            assert health is None, health  # held: GC tried no DEL
            return
        # what GC could not DEL of it (the cached config is no list) is named, with the error
        assert health is not None and health.code is BrokenCode.DEL_FAILED, health
        assert "config list has no string 'name'" in health.reason

    asyncio.run(scenario())


def test_a_listed_pod_whose_pause_runs_is_running_whatever_its_netns_path():
    roster = Roster()
    alive = _pod(KEPT, "alive", pid=os.getpid())  # this process stands in for the pause
    stopped = _pod(GONE, "stopped", pid=os.getpid())
    unknown = _pod(HELD, "unknown")  # pid 0: the runtime said nothing
    roster.listed([alive, stopped, unknown])
    roster.stopped(stopped.id)
    assert pause_alive(os.getpid())
    assert [roster.running(p.id) for p in (alive, stopped, unknown)] == [True, False, False]
    roster.listed([])
    assert not roster.running(alive.id)


def test_an_unlisted_pod_is_valid_only_within_the_grace_whatever_its_netns(tmp_path):
    """A pod attached and then not listed (CRI-O drops a pod whose creation its restart cut,
    leaving the netns pinned) is valid for GC while its attach may still be in flight in the
    runtime (the grace, from the attach) and garbage after it, its netns still there; one the
    runtime lists stays valid past the grace; one listed before and then missed gets the grace
    from the Synchronize that missed it."""
    now = [100.0]
    roster = Roster(clock=lambda: now[0])
    netns = tmp_path / "netns"
    netns.write_text("")  # a netns path that exists: only the grace can end the doubt
    cut, kept, listed_before = (
        PodInfo(i, name=n, namespace="ncver", netns=str(netns))
        for i, n in ((GONE, "cut"), (KEPT, "kept"), (HELD, "old"))
    )
    roster.listed([listed_before])
    for pod in (cut, kept):
        roster.attached(pod)
    now[0] += 5
    roster.listed([kept, listed_before])  # a runtime restart: the cut pod is dropped
    assert roster.valid_pod_ids((), grace=30) == {cut.id, kept.id, listed_before.id}
    now[0] += 26  # 31 s after the attach, one list missed: past the grace, its netns there
    assert roster.valid_pod_ids((), grace=30) == {kept.id, listed_before.id}
    assert roster.valid_pod_ids((), grace=60) == {cut.id, kept.id, listed_before.id}
    roster.listed([kept])  # the pod listed before goes missing (containerd's unknown state)
    now[0] += 29
    assert roster.valid_pod_ids((), grace=30) == {kept.id, listed_before.id}
    now[0] += 2
    assert roster.valid_pod_ids((), grace=30) == {kept.id}
    roster.collected([], set(), grace=30)
    assert all(r.unconfirmed is None and r.attached_at is None for r in roster.view().values())


def test_a_pod_listed_with_ips_and_then_without_has_lost_them():
    """Secondary mode's torn-down: the runtime listed the pod with IPs and, restarted, lists it
    without; listed with IPs again (or dropped) it is no longer so. A pod never listed with IPs
    (nothing known of them) is not."""
    roster = Roster()
    lost, never = _pod(GONE, "lost", ips=("10.9.0.2",)), _pod(KEPT, "never")
    roster.listed([lost, never])
    roster.listed([_pod(GONE, "lost"), never])
    assert {r.pod_id for r in roster.view().values() if r.ips_lost} == {GONE}
    roster.listed([lost, never])
    assert {r.pod_id for r in roster.view().values() if r.ips_lost} == set()
    roster.listed([_pod(GONE, "lost"), never])
    roster.listed([never])
    assert {r.pod_id for r in roster.view().values() if r.ips_lost} == set()


def test_pause_alive_is_false_for_a_zombie_and_a_dead_pid():
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    try:
        # a zombie until waited for: poll its state (an event this test caused, not a sleep)
        for _ in range(100000):
            with open(f"/proc/{pid}/stat", "rb") as f:
                if f.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                    break
        assert not pause_alive(pid)
    finally:
        os.waitpid(pid, 0)
    assert not pause_alive(pid)
    assert not pause_alive(0)


@pytest.mark.parametrize("grace", [0.01, 0.0])  # 0: each timer fires at the loop's first chance
def test_a_teardown_no_removal_follows_asks_the_runtime_for_a_fresh_list(tmp_path, monkeypatch, grace):
    """containerd#8426: a pod that lived through the runtime's restart gets no NRI stop or
    remove; its teardown by the shim's DEL with no NRI stop makes the roster stale (the daemon
    then reconnects for a new list). Not when the pod's events come, and never in native mode
    (a reconnect there makes pods miss nri-cni's answer)."""
    monkeypatch.setattr(verbs, "REMOVAL_GRACE", grace)
    restored, removed, stopped = _pod(GONE, "restored"), _pod(KEPT, "removed"), _pod(HELD, "stopped")

    async def scenario(mode: str) -> tuple[bool, bool]:
        svc = daemon_for(tmp_path / mode, mode=mode).pods
        svc.timers.synchronized([restored, removed, stopped])
        await svc.close()
        await svc.verbs.remove(removed)  # stop and remove as usual
        svc.verbs._removal_due(removed.id)  # what its timer would find: nothing stale
        await svc.verbs.detach(stopped, stop_event=True)  # its NRI stop came: its remove will too
        svc.verbs._removal_due(stopped.id)
        gone_well = not svc.verbs.roster_stale.is_set()
        await svc.verbs.detach(restored)  # its teardown, and nothing after
        try:
            # native mode: no timer, nothing will ever be asked; else the timer is pending, or
            # (a slow loop: the grace passed while the DEL's caller finished) already fired
            if not svc.verbs._removals and not svc.verbs.roster_stale.is_set():
                return gone_well, False
            await asyncio.wait_for(svc.verbs.roster_stale.wait(), 30)  # the event the timer sets
            return gone_well, True
        finally:
            await svc.close()

    assert asyncio.run(scenario("shim")) == (True, True)
    assert asyncio.run(scenario("native")) == (True, False)


def test_a_stop_or_remove_older_than_the_newest_pod_list_that_has_the_pod_changes_nothing(tmp_path):
    """containerd stopped in the middle of a RunPodSandbox sends the pod's NRI stop and remove
    as it goes and, restarted, lists the pod READY with its IP. Events that arrived before that
    list, handled after it (they wait for the pod's lock), neither detach nor forget the pod:
    the list is the runtime's newest word, and verify makes it true.

    Control case: `removed`, listed in that same newest list too, whose events arrived after it:
    no list newer than its events has it, so they detach and forget it as always. (Dropping it
    from the list instead let a product that ignores every stop or remove of a listed pod pass.)"""
    daemon = daemon_for(tmp_path, mode="shim")
    kept, removed = _pod(GONE, "kept", ips=("10.0.0.2",)), _pod(KEPT, "removed")

    async def scenario() -> None:
        svc = daemon.pods
        svc.timers.synchronized([kept, removed])
        await svc.close()
        for pod in (kept, removed):
            async with svc.locks.pod(pod.id):  # an operation in flight: the events wait for it
                stop = asyncio.create_task(svc.verbs.detach(pod, stop_event=True))
                remove = asyncio.create_task(svc.verbs.remove(pod))
                await asyncio.sleep(0.01)  # both arrived
                if pod is kept:  # the restarted runtime's list, before they run: it has both
                    svc.timers.synchronized([kept, removed])
                    await svc.close()  # that list's background GC: not this test's
            await asyncio.gather(stop, remove)
        await svc.close()

    asyncio.run(scenario())
    assert _known(daemon, kept.id) == ["report", "roster.pod"]  # listed, not stopped: verify's
    assert _known(daemon, removed.id) == []  # listed, and its stop and remove did their work
