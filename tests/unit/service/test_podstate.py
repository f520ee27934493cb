from nri_cni.service.podstate import BrokenCode, HealthBook, PodState


def test_repaired_stays_repaired_while_verified_ok():
    book = HealthBook()
    book.ok("a")
    book.repaired("a", "eth0 was missing")
    again = book.ok("a")
    assert again.state is PodState.REPAIRED and again.repairs == 1
    assert book.counts() == {"ok": 0, "repaired": 1, "broken": 0}


def test_broken_keeps_its_since_for_the_same_code_only():
    book = HealthBook()
    first = book.broken("a", BrokenCode.IP_TAKEN, "10.0.0.5 is held by pod b")
    same = book.broken("a", BrokenCode.IP_TAKEN, "10.0.0.5 is held by pod b")
    assert same.since == first.since
    other = book.broken("a", BrokenCode.REPAIR_FAILED, "ADD failed 5 times")
    assert other.code is BrokenCode.REPAIR_FAILED
    assert [h.pod_id for h in book.broken_pods()] == ["a"]
    assert book.get("a").to_dict()["code"] == "repair-failed"
    book.forget("a")
    assert len(book) == 0 and book.get("a") is None
