"""What `nri-cni status`, `nri-cni pods` and `nri-cni verify` show: read from the parts, changing
nothing (verify runs the service's verify, then reads its verdicts like the others)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from nri_cni.daemon import podreport
from nri_cni.daemon.reload import ConfigReloader
from nri_cni.errors import NriCniError
from nri_cni.lifecycle import NetworkLifecycle
from nri_cni.nri.stub import Stub
from nri_cni.pod.model import PodInfo
from nri_cni.service.podstate import PodHealth
from nri_cni.service.readiness import NetworkReadiness
from nri_cni.service.service import PodService
from nri_cni.service.snapshot import ServiceSnapshot

MIN_ID_PREFIX = 6  # `nri-cni verify --pod` takes an id prefix this long or longer, as `nri-cni pods` shows 12


class DaemonReports:
    def __init__(
        self,
        *,
        pods: PodService,
        readiness: NetworkReadiness,
        lifecycle: NetworkLifecycle,
        reloader: ConfigReloader,
        stub: Stub,
    ) -> None:
        self.service = pods
        self.readiness = readiness
        self.lifecycle = lifecycle
        self.reloader = reloader
        self.stub = stub
        self.started = time.time()

    def status(self) -> dict[str, Any]:
        # asked often (probes, benches): no cache entry is read, only counted
        snap, stub = self.service.view.snapshot(attachments=False), self.stub
        cfg = snap.cfg
        # not ready: STATUS fails, or INIT failed (docs/lifecycle.md), or a pod is broken
        # (docs/reliability.md: its networks are wrong and an admin must act)
        errors = self.readiness.failing()
        broken = snap.broken()
        return {
            "mode": snap.mode,
            "ready": stub.synchronized.is_set() and not errors and not broken,
            "nri": {
                "socket": cfg.nri.socket,
                "registered": stub.registered.is_set(),
                "synchronized": stub.synchronized.is_set(),
                "runtime": f"{stub.runtime_name} {stub.runtime_version}".strip(),
                "requestTimeoutMs": stub.request_timeout_ms,
            },
            "networks": {
                n.name: {"ready": n.name not in errors, "error": errors.get(n.name, ""), "default": n.default}
                for n in cfg.networks
            },
            "pods": len(snap.listed),
            "attachments": snap.attachment_count,
            "pendingRepair": sorted(snap.pending_repair),
            "pendingRollback": list(snap.pending_rollback),
            "unconfirmed": snap.unconfirmed,
            # what the daemon keeps per pod besides the cache: all zero on an idle, empty node
            "tracked": {
                "pods": len(snap.listed),
                "operations": snap.operations,
                "unconfirmed": snap.unconfirmed,
                "repair": len(snap.pending_repair),
                "background": snap.background,
            },
            "uptimeSeconds": round(time.time() - self.started, 1),
            "verify": _rounds(snap),
            "podStates": dict(snap.counts),
            # broken pods make the node not ready (nri_cni/cli/health.py): named, with the reason
            "broken": [_verdict(h, snap.listed) for h in broken],
            "lifecycle": self.lifecycle.report(),
            "reload": self.reloader.report(),
        }

    def pods(self) -> list[dict[str, Any]]:
        """Every pod, in the shape of Multus's network-status (nri_cni/daemon/podreport.py)."""
        snap = self.service.view.snapshot(runtime_attachments=True)
        return podreport.pods_report(
            list(snap.attachments),
            podreport.PodsView(
                snap.listed,
                set(snap.pending_repair),
                set(snap.pending_rollback),
                verdicts={h.pod_id: h.to_dict() for h in snap.verdicts},
            ),
            runtime_entries=list(snap.runtime_attachments),
            names={n.name: n.nad for n in snap.cfg.networks if n.nad},
        )

    async def verify(self, pod_id: str | None = None, *, check: bool = False) -> list[dict[str, Any]]:
        """`nri-cni verify`: one verify now (of one pod, or all), each pod's verdict."""
        wanted = _pod_id(pod_id, self.service.view.snapshot(attachments=False).listed) if pod_id else None
        verdicts = await self.service.timers.verify(wanted, check=check)
        listed = self.service.view.snapshot(attachments=False).listed
        return sorted(
            (_verdict(h, listed) for h in verdicts), key=lambda v: (v["namespace"], v["name"], v["pod"])
        )


def _pod_id(wanted: str, listed: Mapping[str, PodInfo]) -> str:
    """The pod `nri-cni verify --pod` names: its id, a unique prefix of it, or namespace/name."""
    if wanted in listed:
        return wanted
    found = {p.id for p in listed.values() if f"{p.namespace}/{p.name}" == wanted}
    if not found and len(wanted) >= MIN_ID_PREFIX:
        found = {pid for pid in listed if pid.startswith(wanted)}
    if len(found) == 1:
        return found.pop()
    if found:
        raise NriCniError(f"{len(found)} pods match {wanted!r}: give more of the id")
    raise NriCniError(f"no pod {wanted!r} (give its id, a unique prefix of it, or namespace/name)")


def _verdict(health: PodHealth, listed: Mapping[str, PodInfo]) -> dict[str, Any]:
    """A PodHealth as the reports show it: with the pod's namespace and name when known."""
    info = listed.get(health.pod_id)
    return {
        **health.to_dict(),
        "namespace": info.namespace if info else "",
        "name": info.name if info else "",
    }


def _rounds(snap: ServiceSnapshot) -> dict[str, Any]:
    """ "verified": a verify round over every pod finished since the daemon started."""
    r = snap.rounds
    return {
        "verified": r.count > 0,
        "rounds": r.count,
        "lastRound": round(r.last, 3) if r.last is not None else None,
        "lastRoundSeconds": round(r.last_seconds, 4),
        # the cadence CHECKs follow a round (service/checker.py): the rounds whose CHECKs are done
        "checkedRounds": r.checked,
        "checksDone": round(r.checks_done, 3) if r.checks_done is not None else None,
    }
