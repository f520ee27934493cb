"""The tables `nri-cni pods` and `nri-cni verify` print from the daemon's reports (the reports
themselves: nri_cni/daemon/podreport.py)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence


def format_age(seconds: float) -> str:
    """kubectl's way: 45s, 12m, 3h, 5d."""
    seconds = max(0, int(seconds))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def pods_table(data: list[dict], now: float) -> str:
    rows = [("POD", "STATE", "VERIFY", "NETWORK", "INTERFACE", "IPS", "MAC", "AGE", "REASON")]
    for pod in data:
        label = _label(pod["id"], pod["namespace"], pod["name"])
        age = format_age(now - pod["attachedAt"]) if pod.get("attachedAt") else "-"
        verdict = pod.get("verify") or {}
        networks = pod["network-status"] or [{"name": "-", "interface": "-"}]
        for i, net in enumerate(networks):
            first = i == 0
            rows.append(
                (
                    label if first else "",
                    pod["state"] if first else "",
                    (verdict.get("state") or "-") if first else "",
                    net["name"],
                    net.get("interface") or "-",
                    ",".join(net.get("ips") or ()) or "-",
                    net.get("mac") or "-",
                    age if first else "",
                    _reason(verdict) if first else "",
                )
            )
    return table(rows)


def _reason(verdict: Mapping) -> str:
    """broken: code and reason; repaired: how often and what was wrong; ok: nothing."""
    if verdict.get("state") == "broken":
        return f"{verdict.get('code')}: {verdict.get('reason')}"
    if verdict.get("state") == "repaired":
        return f"{verdict.get('repairs')} repair(s): {verdict.get('reason')}"
    return ""


def verify_table(data: list[dict]) -> str:
    """`nri-cni verify`: one row per pod, with what differs (an attachment's finding)."""
    if not data:
        return "no pod to verify"
    rows = [("POD", "STATE", "REASON", "FINDINGS")]
    for v in data:
        state = v["state"] + (f" ({v['code']})" if v.get("code") else "")
        findings = [
            f"{a['network']}/{a['interface']}: {a['finding']}"
            + (f" ({a['detail']})" if a.get("detail") else "")
            for a in v.get("attachments") or ()
            if a["finding"] != "ok"
        ]
        rows.append(
            (
                _label(v["pod"], v["namespace"], v["name"]),
                state,
                v.get("reason") or "-",
                "; ".join(findings) or "-",
            )
        )
    return table(rows)


def _label(pod_id: str, namespace: str, name: str) -> str:
    return f"{namespace}/{name}" if name else pod_id[:12]


def table(rows: Sequence[Sequence[str]]) -> str:
    """Columns padded to their widest cell, as kubectl prints them."""
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows)
