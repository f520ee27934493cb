"""Reporting: `nri-cni verify`, and the verdicts in `nri-cni status`, `nri-cni pods`
and the metrics.

The verify engine itself (ServiceTimers.verify: netlink, CHECK, repair) has its own tests; here the
daemon is real and its pod service's `verify` is a double that writes verdicts into the health
book as the engine does, so what is tested is the path from the book (and the call) to what an
admin reads: the local socket op, the CLI's tables, JSON and exit codes."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path

import jsonschema
from prometheus_client.parser import text_string_to_metric_families

from nri_cni.cli import health
from nri_cni.errors import NriCniError
from nri_cni.metrics.endpoint import Metrics
from nri_cni.pod.model import PodInfo
from nri_cni.pod.oprecord import OpRecord
from nri_cni.service.podstate import AttachmentVerdict, BrokenCode, HealthBook, PodHealth
from tests.support.harness import DaemonHarness, new_pod_id, pod_message, run

ROOT = Path(__file__).resolve().parents[3]
SCHEMA = json.loads((ROOT / "docs" / "network-status.schema.json").read_text())
POD_REPORT = {**SCHEMA, "$ref": "#/$defs/podReport", "type": "object"}
POD_REPORT.pop("items")
TAKEN = "its IP 10.244.9.7 is held by pod default/other"


async def cli(*args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "nri_cni.cli",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    return proc.returncode, out.decode(), err.decode()


class VerifyDouble:
    """ServiceTimers.verify's contract: verify one pod (or all), record each verdict in the health
    book, finish a round when all were verified, return the verdicts."""

    def __init__(self, book: HealthBook, broken: set[str], ids: list[str]) -> None:
        self.book = book
        self.broken = broken
        self.ids = ids
        self.calls: list[tuple[str | None, bool]] = []

    async def __call__(self, pod_id: str | None = None, *, check: bool = False) -> list[PodHealth]:
        self.calls.append((pod_id, check))
        started = time.time()
        out = []
        for pid in self.ids if pod_id is None else [pod_id]:
            if pid in self.broken:
                seen = [AttachmentVerdict("podnet", "eth0", "link-missing", "no eth0 in the netns")]
                out.append(self.book.broken(pid, BrokenCode.IP_TAKEN, TAKEN, seen))
            else:
                out.append(self.book.ok(pid, [AttachmentVerdict("podnet", "eth0", "ok")]))
        if pod_id is None:
            self.book.round_done(started, time.time())
        return out


def test_verify_status_and_pods_report_the_verdicts(node):
    nets = [{"name": "podnet", "default": True, "conflist": node.bridge_net("podnet", "10.244.41.0/24")}]
    cfg = node.config("shim", nets)
    # the CLI's rounds are the only ones: none after Synchronize, and the timer's first round a
    # day away (at the default 30 s, a loaded machine ran one between the test's calls)
    cfg["repair_on_sync"] = False
    cfg["verify"] = {"interval": "24h"}
    cfg["daemon"]["allowed_uids"] = [os.geteuid()]  # the unit subset runs as nobody too
    sock = cfg["daemon"]["socket"]
    web = pod_message(new_pod_id(), "", name="web", namespace="default")
    db = pod_message(new_pod_id(), "", name="db", namespace="default")

    async def scenario():
        async with DaemonHarness(node, cfg, pods=[web, db]) as h:
            book = h.daemon.pods.health
            double = VerifyDouble(book, broken=set(), ids=[web.id, db.id])
            h.daemon.pods.timers.verify = double  # the engine's place (ServiceTimers.verify)

            # before any verify: ready, "not verified yet", no verdict in the pods report
            code, out, _ = await cli("status", "--socket", sock)
            assert code == health.READY, out
            assert "verify:     not verified yet" in out
            code, raw, _ = await cli("pods", "--socket", sock, "-o", "json")
            assert code == 0 and [p["verify"] for p in json.loads(raw)] == [None, None]

            # all ok: exit 0, the table, and the round in status
            code, out, err = await cli("verify", "--socket", sock)
            assert (code, err) == (0, ""), out
            rows = {ln.split()[0]: ln.split() for ln in out.splitlines()[1:]}
            assert rows["default/web"][1:3] == ["ok", "-"] and rows["default/db"][1] == "ok"
            assert double.calls == [(None, False)]
            code, raw, _ = await cli("status", "--socket", sock, "-o", "json")
            status = json.loads(raw)
            assert code == health.READY and status["verify"]["verified"] and status["verify"]["rounds"] == 1
            assert status["podStates"] == {"ok": 2, "repaired": 0, "broken": 0} and status["broken"] == []

            # db's IP is taken: verify exits 1 and says why; status is not ready and names it
            double.broken.add(db.id)
            code, raw, _ = await cli("verify", "--socket", sock, "--check", "-o", "json")
            assert code == 1 and double.calls[-1] == (None, True)
            by_name = {v["name"]: v for v in json.loads(raw)}
            assert by_name["db"]["state"] == "broken" and by_name["db"]["code"] == "ip-taken"
            assert by_name["db"]["reason"] == TAKEN and by_name["web"]["state"] == "ok"
            assert by_name["db"]["attachments"][0]["finding"] == "link-missing"
            code, out, _ = await cli("verify", "--socket", sock)
            assert code == 1
            assert "broken (ip-taken)" in out and TAKEN in out and "podnet/eth0: link-missing" in out
            code, out, _ = await cli("status", "--socket", sock)
            assert code == health.NOT_READY
            assert "1 pod(s) broken: default/db (ip-taken)" in out
            assert f"broken pod default/db: ip-taken: {TAKEN}" in out
            assert "verified: 1 ok, 1 broken; last round" in out and "(3 round(s))" in out
            assert "ready:      NO" in out

            # pods: the verdict column and its reason; JSON valid against the schema
            code, out, _ = await cli("pods", "--socket", sock)
            assert code == 0
            header, *lines = out.splitlines()
            assert header.split()[:3] == ["POD", "STATE", "VERIFY"]
            db_row = next(ln for ln in lines if ln.startswith("default/db"))
            assert db_row.split()[2] == "broken" and db_row.endswith(f"ip-taken: {TAKEN}")
            code, raw, _ = await cli("pods", "--socket", sock, "-o", "json")
            pods = json.loads(raw)
            jsonschema.Draft202012Validator.check_schema(POD_REPORT)
            for pod in pods:
                jsonschema.validate(pod, POD_REPORT)
            verdicts = {p["name"]: p["verify"] for p in pods}
            assert verdicts["db"]["state"] == "broken" and verdicts["web"] == {
                "state": "ok",
                "code": "",
                "reason": "",
                "since": verdicts["web"]["since"],
                "repairs": 0,
            }

            # one pod, by namespace/name and by an id prefix; unknown pods are an error (exit 2)
            code, out, _ = await cli("verify", "--socket", sock, "--pod", "default/web")
            assert code == 0 and double.calls[-1] == (web.id, False) and "default/db" not in out
            code, _, _ = await cli("verify", "--socket", sock, "--pod", db.id[:10])
            assert code == 1 and double.calls[-1] == (db.id, False)
            calls = len(double.calls)
            code, _, err = await cli("verify", "--socket", sock, "--pod", "default/nope")
            assert code == 2 and "no pod 'default/nope'" in err and len(double.calls) == calls

            # the verdict goes with the pod
            book.forget(db.id)
            code, out, _ = await cli("status", "--socket", sock)
            assert code == health.READY, out

        # no daemon: exit 2, as `status`
        code, _, err = await cli("verify", "--socket", sock)
        assert code == 2 and "not reachable" in err

    run(scenario())


def test_health_names_broken_pods_and_counts_the_rest():
    report = {
        "nri": {"synchronized": True, "registered": True},
        "networks": {"podnet": {"ready": True, "default": True}},
        "broken": [
            {"pod": f"{i:064x}", "namespace": "ns", "name": f"p{i}", "code": "repair-failed"}
            for i in range(12)
        ],
    }
    verdict = health.assess(report)
    assert verdict.code == health.NOT_READY
    assert verdict.reasons == [
        "12 pod(s) broken: " + ", ".join(f"ns/p{i} (repair-failed)" for i in range(10)) + " and 2 more"
        " (nri-cni pods shows why)"
    ]
    assert health.assess({**report, "broken": []}).code == health.READY


def test_metrics_count_pods_by_verdict_and_repairs():
    book = HealthBook()
    metrics = Metrics(pod_states=book.counts)  # given at construction: nothing set afterwards

    def scrape() -> dict[tuple[str, str], float]:
        fams = text_string_to_metric_families(metrics.render())
        return {
            (s.name, s.labels.get("state") or s.labels.get("result", "")): s.value
            for f in fams
            if f.name in ("nri_cni_pods", "nri_cni_pod_repairs")
            for s in f.samples
        }

    assert scrape() == {
        ("nri_cni_pods", "ok"): 0,
        ("nri_cni_pods", "repaired"): 0,
        ("nri_cni_pods", "broken"): 0,
    }
    book.ok("a" * 64)
    book.repaired("b" * 64, "eth0 was missing")
    book.broken("c" * 64, BrokenCode.MISSED, "created while nri-cni was down")
    pod = PodInfo(id="b" * 64, name="web", namespace="default")
    metrics.observe_operation(OpRecord("repair", pod))
    metrics.observe_operation(OpRecord("add", pod))  # not a repair
    failed = OpRecord("repair", pod)
    failed.fail(NriCniError("the ADD with the same IP failed"))
    metrics.observe_operation(failed)
    assert scrape() == {
        ("nri_cni_pods", "ok"): 1,
        ("nri_cni_pods", "repaired"): 1,
        ("nri_cni_pods", "broken"): 1,
        ("nri_cni_pod_repairs_total", "ok"): 1,
        ("nri_cni_pod_repairs_total", "error"): 1,
    }
