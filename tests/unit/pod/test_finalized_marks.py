"""The marks of pods whose runtime primary had its FINALIZE (secondary mode): they go with the
pod's detach, and GC drops those of pods the runtime no longer lists or whose netns is gone."""

from __future__ import annotations

import asyncio
import os

from nri_cni.pod.finalized import FinalizedMarks
from nri_cni.pod.model import PodInfo
from tests.support.delrecorder import del_recording_plan

LISTED, UNLISTED, NETNS_GONE = ("a" * 64, "b" * 64, "c" * 64)


def test_a_mark_holds_the_netns_and_goes_with_forget(tmp_path):
    marks = FinalizedMarks(str(tmp_path))
    assert not marks.done(LISTED) and marks.all() == {}
    marks.mark(LISTED, "/run/netns/x")
    assert marks.done(LISTED) and marks.all() == {LISTED: "/run/netns/x"}
    marks.forget(LISTED)
    marks.forget(LISTED)  # twice: nothing there, no error
    assert not marks.done(LISTED) and os.listdir(tmp_path / "finalized") == []


def test_detach_and_gc_drop_the_marks_of_pods_that_are_gone(tmp_path):
    plan = del_recording_plan(tmp_path, fail=set())
    netns = tmp_path / "netns"
    netns.mkdir()
    (netns / "alive").touch()
    plan.finalized.mark(LISTED, str(netns / "alive"))
    plan.finalized.mark(UNLISTED, str(netns / "alive"))
    plan.finalized.mark(NETNS_GONE, str(netns / "gone"))
    asyncio.run(plan.collect_garbage({LISTED, NETNS_GONE}))
    assert set(plan.finalized.all()) == {LISTED}
    asyncio.run(plan.detach(PodInfo(LISTED)))
    assert plan.finalized.all() == {}
