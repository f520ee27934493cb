"""An operation's record names instants: its own marks (ms from its start) and the ones its
request passed before it began (`arrival`, negative), all in the log line."""

import contextvars
import json
import logging
import time

from nri_cni.pod.model import PodInfo
from nri_cni.pod.oprecord import OpRecord, arrival


def _line(record: OpRecord, caplog) -> dict:
    with caplog.at_level(logging.INFO, logger="nri_cni.podop"):
        record.emit()
    return json.loads(caplog.records[-1].getMessage())


def test_arrival_stamps_become_negative_marks(caplog):
    accepted = time.perf_counter() - 0.004

    def in_request() -> OpRecord:
        arrival({"accepted": accepted, "read": accepted + 0.002})
        record = OpRecord("add", PodInfo("p1"))
        record.mark("intent written")
        return record

    record = contextvars.copy_context().run(in_request)
    marks = _line(record, caplog)["marks"]
    assert list(marks) == ["accepted", "read", "intent written"]
    assert marks["accepted"] == round((accepted - record.t0) * 1000, 2)
    assert marks["accepted"] < marks["read"] < 0 <= marks["intent written"]


def test_a_record_outside_a_request_has_no_arrival_marks(caplog):
    # control: the same record made in a context where no request arrived
    record = contextvars.copy_context().run(lambda: OpRecord("add", PodInfo("p1")))
    assert "marks" not in _line(record, caplog)
    record.mark("finalized")
    assert list(_line(record, caplog)["marks"]) == ["finalized"]
