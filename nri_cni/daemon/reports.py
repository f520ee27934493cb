"""What `nri-cni status` and `nri-cni pods` show: read from the parts, changing nothing."""

from __future__ import annotations

import time
from typing import Any

from nri_cni.app.readiness import NetworkReadiness
from nri_cni.app.service import PodService
from nri_cni.cni.result_parse import parse_result
from nri_cni.daemon.reload import ConfigReloader
from nri_cni.lifecycle import NetworkLifecycle
from nri_cni.nri.stub import Stub
from nri_cni.pod.model import K8S_POD_NAME, K8S_POD_NAMESPACE


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
        # not ready: STATUS fails, or INIT failed (docs/lifecycle.md)
        errors = self.readiness.failing()
        hooks = self.service.plan.hooks
        return {
            "mode": self.service.mode.name,
            "ready": stub.synchronized.is_set() and not errors,
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
                "hooks": len(hooks) if hooks else 0,
                "background": self.service.background(),
            },
            "uptimeSeconds": round(time.time() - self.started, 1),
            "lifecycle": self.lifecycle.report(),
            "reload": self.reloader.report(),
        }

    def pods(self) -> list[dict[str, Any]]:
        pods: dict[str, dict[str, Any]] = {}
        for entry in self.service.attachments():
            args = dict(entry.cni_args)
            pod = pods.setdefault(
                entry.container_id,
                {
                    "id": entry.container_id,
                    "namespace": args.get(K8S_POD_NAMESPACE, ""),
                    "name": args.get(K8S_POD_NAME, ""),
                    "networks": [],
                },
            )
            result = parse_result(entry.result) if entry.result else None
            pod["networks"].append(
                {
                    "network": entry.network_name,
                    "interface": entry.ifname,
                    "ips": [ip.address for ip in result.ips] if result else [],
                    "mac": next((i.mac for i in result.interfaces if i.name == entry.ifname), "")
                    if result
                    else "",
                }
            )
        for pod in pods.values():
            pod["networks"].sort(key=lambda n: (n["interface"] != "eth0", n["interface"]))
        return sorted(pods.values(), key=lambda p: (p["namespace"], p["name"], p["id"]))
