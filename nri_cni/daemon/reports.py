"""What `nri-cni status`, `nri-cni pods` and `nri-cni verify` show: read from the parts, changing
nothing (verify runs the service's verify, then reads its verdicts like the others)."""

from __future__ import annotations

import time
from typing import Any

from nri_cni.daemon import podreport
from nri_cni.daemon.reload import ConfigReloader
from nri_cni.errors import NriCniError
from nri_cni.lifecycle import NetworkLifecycle
from nri_cni.nri.stub import Stub
from nri_cni.service.podstate import PodHealth
from nri_cni.service.readiness import NetworkReadiness
from nri_cni.service.service import PodService

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
        cfg, ledger, stub = self.service.cfg, self.service.ledger, self.stub
        # not ready: STATUS fails, or INIT failed (docs/lifecycle.md), or a pod is broken
        # (docs/reliability.md: its networks are wrong and an admin must act)
        errors = self.readiness.failing()
        broken = self.service.health.broken_pods()
        return {
            "mode": self.service.mode.name,
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
            "pods": len(ledger.pods),
            "attachments": len(self.service.attachments()),
            "pendingRepair": sorted(ledger.repair),
            "pendingRollback": self.service.pending_rollbacks(),
            "unconfirmed": len(ledger.unconfirmed),
            # what the daemon keeps per pod besides the cache: all zero on an idle, empty node
            "tracked": {
                "pods": len(ledger.pods),
                "operations": len(self.service.locks),
                "unconfirmed": len(ledger.unconfirmed),
                "repair": len(ledger.repair),
                "background": self.service.background(),
            },
            "uptimeSeconds": round(time.time() - self.started, 1),
            "verify": self._verify_rounds(),
            "podStates": self.service.health.counts(),
            # broken pods make the node not ready (nri_cni/health.py): named, with the reason
            "broken": [self._verdict(h) for h in broken],
            "lifecycle": self.lifecycle.report(),
            "reload": self.reloader.report(),
        }

    def pods(self) -> list[dict[str, Any]]:
        """Every pod, in the shape of Multus's network-status (nri_cni/podreport.py)."""
        cfg, ledger = self.service.cfg, self.service.ledger
        return podreport.pods_report(
            self.service.attachments(),
            podreport.PodState(
                ledger.pods,
                set(ledger.repair),
                set(self.service.pending_rollbacks()),
                verdicts={h.pod_id: h.to_dict() for h in self.service.health.all()},
            ),
            runtime_entries=self.service.mode.runtime_attachments(),
            names={n.name: n.nad for n in cfg.networks if n.nad},
        )

    async def verify(self, pod_id: str | None = None, *, check: bool = False) -> list[dict[str, Any]]:
        """`nri-cni verify`: one verify now (of one pod, or all), each pod's verdict."""
        verdicts = await self.service.verify(self._pod_id(pod_id) if pod_id else None, check=check)
        return sorted(
            (self._verdict(h) for h in verdicts), key=lambda v: (v["namespace"], v["name"], v["pod"])
        )

    def _pod_id(self, wanted: str) -> str:
        """The pod `nri-cni verify --pod` names: its id, a unique prefix of it, or namespace/name."""
        listed = self.service.ledger.pods
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

    def _verdict(self, health: PodHealth) -> dict[str, Any]:
        """A PodHealth as the reports show it: with the pod's namespace and name when known."""
        info = self.service.ledger.pods.get(health.pod_id)
        return {
            **health.to_dict(),
            "namespace": info.namespace if info else "",
            "name": info.name if info else "",
        }

    def _verify_rounds(self) -> dict[str, Any]:
        """ "verified": a verify round over every pod finished since the daemon started."""
        book = self.service.health
        return {
            "verified": book.rounds > 0,
            "rounds": book.rounds,
            "lastRound": round(book.last_round, 3) if book.last_round is not None else None,
            "lastRoundSeconds": round(book.last_round_seconds, 4),
        }
