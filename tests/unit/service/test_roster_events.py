"""Each roster event's effect on a pod's record (service/roster.py), without a daemon: what it
sets, what it clears, and what it leaves; each beside its control (the same roster with the one
event or input changed that must flip the outcome)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from nri_cni.pod.model import PodInfo
from nri_cni.service.roster import PodRecord, Roster, Unconfirmed

A, B = "a" * 64, "b" * 64


def pod(pod_id: str = A, netns: str = "/nonexistent/netns", ips: tuple[str, ...] = ()) -> PodInfo:
    return PodInfo(pod_id, name=pod_id[:4], namespace="ncver", netns=netns, ips=ips)


def clocked(start: float = 100.0) -> tuple[Roster, list[float]]:
    now = [start]
    return Roster(clock=lambda: now[0]), now


def torn_down_and_relisted(roster: Roster, p: PodInfo) -> None:
    roster.listed([p])
    roster.stopped(p.id)
    roster.listed([p])  # listed again after its teardown: relisted
    roster.stopped(p.id)


def test_a_record_of_an_unknown_pod_is_empty_and_names_it():
    roster = Roster()
    assert roster.record(A) == PodRecord(A) and roster.record(A).empty
    roster.settled(A)  # an event for a pod nothing is known of leaves nothing
    roster.removed(A)
    assert dict(roster.view()) == {}


def test_the_view_is_the_records_read_only_and_live():
    """A view taken before an event shows it (the record the event made, the same one `record`
    gives); a pod removed leaves it; nothing is written through it. Control: the record read
    before the event is not stopped."""
    roster = Roster()
    roster.listed([pod(A), pod(B)])
    view = roster.view()
    before = view[A]
    roster.stopped(A)
    assert not before.stopped  # control
    assert view[A].stopped and view[A] is roster.record(A)
    roster.removed(B)
    assert list(view) == [A]
    with pytest.raises(TypeError):
        view[B] = PodRecord(B)  # type: ignore[index]
    assert list(view) == [A]


def test_seen_makes_a_torn_down_pod_the_runtime_s_again():
    roster = Roster()
    p = pod()
    torn_down_and_relisted(roster, p)
    assert (roster.record(A).stopped, roster.record(A).relisted) == (True, True)  # control: not seen
    seen = dataclasses.replace(p, ips=("10.1.0.2",))
    roster.seen(seen)
    rec = roster.record(A)
    assert (rec.pod, rec.stopped, rec.relisted) == (seen, False, False)


def test_attached_starts_the_grace_and_undoes_a_teardown():
    roster, now = clocked()
    p = pod()
    torn_down_and_relisted(roster, p)
    now[0] = 130.0
    roster.attached(p)
    rec = roster.record(A)
    assert (rec.unconfirmed, rec.attached_at, rec.stopped, rec.relisted) == (
        Unconfirmed(roster.lists, p.netns, 130.0),
        130.0,
        False,
        False,
    )
    roster.stopped(A)  # control: a teardown ends both
    rec = roster.record(A)
    assert (rec.unconfirmed, rec.attached_at, rec.stopped) == (None, None, True)


def test_an_answer_gives_its_ips_to_a_pod_listed_without():
    roster = Roster()
    roster.listed([pod(A), pod(B, ips=("10.1.0.9",))])
    roster.answered(A, ("10.1.0.2",))
    roster.answered(B, ("10.1.0.2",))  # control: the runtime's own IPs stand
    roster.answered("c" * 64, ("10.1.0.3",))  # control: a pod the roster does not have
    assert roster.pods() == {A: pod(A, ips=("10.1.0.2",)), B: pod(B, ips=("10.1.0.9",))}
    assert roster.record("c" * 64).empty


def test_a_missed_answer_leaves_the_pod_without_ips_and_says_why():
    roster = Roster()
    p = pod(ips=("10.1.0.2",))
    roster.listed([p])
    roster.stopped(A)
    roster.listed([p])  # relisted
    roster.attached(p)
    roster.missed(A, "past the deadline")
    rec = roster.record(A)
    assert (rec.pod, rec.late, rec.unconfirmed, rec.relisted) == (pod(), "past the deadline", None, False)
    roster.missed(B, "late")  # control: a pod not known: no pod made up
    assert (roster.record(B).pod, roster.record(B).late) == (None, "late")


def test_settled_ends_an_attach_retry():
    roster = Roster()
    roster.attach_failed(A)
    roster.attach_failed(B)
    roster.settled(A)
    assert roster.pending_repair() == {B}  # control: B not settled
    assert roster.record(A).empty and list(roster.view()) == [B]


def test_a_list_that_has_a_pod_confirms_it_and_records_a_relisting():
    roster, now = clocked()
    kept, torn = pod(A), pod(B)
    roster.listed([torn])
    roster.stopped(B)
    roster.attached(kept)
    roster.listed([kept, torn])
    a, b = roster.record(A), roster.record(B)
    assert (a.unconfirmed, a.attached_at, a.stopped, a.relisted) == (None, None, False, False)
    assert (b.stopped, b.relisted) == (False, True)  # control: A was not torn down


def test_a_list_that_misses_a_pod_clears_all_but_its_grace():
    roster, now = clocked()
    p = pod(ips=("10.1.0.2",))
    roster.listed([p])
    roster.stopped(A)
    roster.listed([p])
    roster.listed([pod()])  # relisted, its IPs lost
    roster.stop_announced(A)
    roster.attach_failed(A)
    roster.attach_failed(B)  # control: a pod the runtime never had gets no grace
    now[0] = 150.0
    roster.listed([])
    assert roster.record(A) == PodRecord(A, unconfirmed=Unconfirmed(3, p.netns, 150.0))
    assert roster.record(B).empty


def test_a_pod_missed_after_its_attach_counts_its_grace_from_the_attach():
    roster, now = clocked()
    p = pod()
    roster.seen(p)
    roster.attached(p)
    roster.missed(A, "late")  # its grace ends, its attach time stays
    now[0] = 140.0
    roster.listed([])
    assert roster.record(A).unconfirmed == Unconfirmed(0, p.netns, 100.0)
    # control: a pod seen, never attached, counts from the list that missed it
    roster.seen(pod(B))
    roster.listed([])
    assert roster.record(B).unconfirmed == Unconfirmed(1, p.netns, 140.0)


def test_a_pod_is_listed_since_an_event_only_by_a_newer_list():
    roster = Roster()
    roster.seen(pod())
    assert not roster.listed_since(A, 0)  # no list yet
    assert not roster.synced
    roster.listed([pod()])
    assert roster.listed_since(A, 0) and roster.synced  # control: a list came
    assert not roster.listed_since(A, 1)


def test_the_grace_ends_at_its_length_and_after_two_lists(tmp_path: Path):
    netns = tmp_path / "netns"
    netns.write_text("")
    roster, now = clocked()
    roster.attached(pod(A, str(netns)))
    now[0] = 129.5
    assert roster.unconfirmed_valid(30) == {A}
    now[0] = 130.0  # control: half a second later
    assert roster.unconfirmed_valid(30) == set()
    now[0] = 100.0
    roster.listed([])
    assert roster.unconfirmed_valid(30) == {A}  # missed by one list
    roster.listed([])  # control: by two
    assert roster.unconfirmed_valid(30) == set()


def test_a_gc_forgets_the_grace_of_what_it_deleted_and_of_what_is_no_longer_valid(tmp_path: Path):
    netns = tmp_path / "netns"
    netns.write_text("")
    roster, now = clocked()
    for pod_id in (A, B):
        roster.attached(pod(pod_id, str(netns)))
    roster.collected([f"podnet/{A}/eth0"], set(), grace=30)
    assert (roster.record(A).unconfirmed, roster.record(A).attached_at) == (None, None)
    assert roster.record(B).unconfirmed is not None  # control: B not deleted, within its grace
    now[0] = 200.0  # past the grace: B goes unless an attachment of it is still there
    roster.collected([], {B}, grace=30)
    assert roster.record(B).unconfirmed is not None
    roster.collected([], set(), grace=30)  # control: none
    assert roster.record(B).empty


def test_a_teardown_of_a_pod_without_a_record_is_kept_only_before_the_runtime_s_list():
    roster = Roster()
    roster.stopped(A)  # nri-cni restarted in the runtime's stop: its DEL comes before the list
    roster.listed([pod(A)])
    assert (roster.record(A).stopped, roster.record(A).relisted) == (False, True)
    roster.stopped(B)  # after the list: containerd's DEL after its RemovePodSandbox
    assert roster.record(B).empty and list(roster.view()) == [A]
    roster.stopped(A)  # control: a pod with a record is torn down whatever the list
    assert roster.record(A).stopped
