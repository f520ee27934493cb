"""`nri-cni status` for probes: one verdict from the daemon's status report.

Exit codes (Kubernetes probes and scripts read them):
  0 ready      synchronized with the runtime, the default network's STATUS passes, nothing pending
  1 degraded   pods can be attached, but something needs a look: a network that is not the
               default failing STATUS or INIT, a config change refused (the running one stays),
               attachments waiting for repair or rollback, a DEINIT failing
  2 not ready  not synchronized with the runtime, or the default network failing (no pod can
               get its eth0), or a pod broken (its networks are not what it should have and
               nri-cni will not repair them: an admin must act, docs/reliability.md); also when
               the daemon cannot be reached at all
"""

from __future__ import annotations

from dataclasses import dataclass, field

READY, DEGRADED, NOT_READY = 0, 1, 2
MAX_NAMED = 10  # broken pods named in the verdict; the rest are counted
NAMES = {READY: "ready", DEGRADED: "degraded", NOT_READY: "not ready"}


@dataclass(frozen=True)
class Health:
    code: int
    reasons: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return NAMES[self.code]

    def line(self) -> str:
        return self.name + (": " + "; ".join(self.reasons) if self.reasons else "")


def unreachable(error: str) -> Health:
    return Health(NOT_READY, [error])


def assess(report: dict) -> Health:
    """The verdict for one status report (DaemonReports.status, nri_cni/daemon/reports.py)."""
    fatal: list[str] = []
    minor: list[str] = []
    nri = report.get("nri") or {}
    if not nri.get("synchronized"):
        fatal.append(
            "not synchronized with the runtime" + ("" if nri.get("registered") else " (not registered)")
        )
    networks = report.get("networks") or {}
    failing = {name: st for name, st in networks.items() if not st.get("ready")}
    # secondary mode has no default network of its own: then only all failing is fatal
    defaults = {name for name, st in networks.items() if st.get("default")}
    for name, st in failing.items():
        text = f"network {name} not ready: {st.get('error') or 'no reason given'}"
        fatal_one = name in defaults or (not defaults and len(failing) == len(networks))
        (fatal if fatal_one else minor).append(text)
    broken = report.get("broken") or []
    if broken:
        names = ", ".join(_label(pod) for pod in broken[:MAX_NAMED])
        more = f" and {len(broken) - MAX_NAMED} more" if len(broken) > MAX_NAMED else ""
        fatal.append(f"{len(broken)} pod(s) broken: {names}{more} (nri-cni pods shows why)")
    refused = (report.get("reload") or {}).get("refused")
    if refused:
        minor.append(f"config change refused (running config kept): {refused}")
    if report.get("pendingRepair"):
        minor.append(f"{len(report['pendingRepair'])} pod(s) waiting for repair")
    if report.get("pendingRollback"):
        minor.append(f"{len(report['pendingRollback'])} interrupted ADD(s) waiting for rollback")
    for name, lc in (report.get("lifecycle") or {}).items():
        for old in lc.get("retired", []):
            if old.get("error"):
                minor.append(f"network {name}: DEINIT of generation {old['generation']} failing")
    if fatal:
        return Health(NOT_READY, fatal + minor)
    return Health(DEGRADED, minor) if minor else Health(READY)


def _label(pod: dict) -> str:
    name = f"{pod.get('namespace')}/{pod.get('name')}" if pod.get("name") else str(pod.get("pod", "?"))[:12]
    return f"{name} ({pod.get('code') or 'broken'})"
