"""Every finding `nri-cni verify` can report and every broken code, with how fast each is
noticed, what repair does and what an admin does (`nri-cni verify --kinds`; docs/reliability.md
says the same in prose)."""

from __future__ import annotations

from dataclasses import dataclass

ROUND = "the next verify round (verify.interval, 30 s)"
REPAIR_SAME_IPS = "DEL, ADD asking for the same IPs, FINALIZE (the pod: repaired)"
DELETE_POD = "nothing, if repaired; if reported broken, what its code says (delete the pod)"


@dataclass(frozen=True)
class FindingDoc:
    kind: str  # an attachment's finding (AttachmentVerdict.finding) or a pod's broken code
    what: str
    noticed: str
    repair: str
    admin: str


FINDINGS = (
    FindingDoc("ok", "the attachment is what nri-cni recorded", ROUND, "nothing", "nothing"),
    FindingDoc("netns-gone", "the pod's netns is gone and the runtime tore the pod down", "the reaper (status.interval) and GC",
               "DEL (IPs released): the pod is gone", "nothing"),
    FindingDoc("link-missing", "no interface of that name in the pod's netns", ROUND, REPAIR_SAME_IPS, DELETE_POD),
    FindingDoc("host-link-missing", "a host-side link of the result (bridge, veth) is gone", ROUND, REPAIR_SAME_IPS,
               DELETE_POD),
    FindingDoc("port-detached", "the host veth is no port of the result's bridge (bridge made again)", ROUND,
               REPAIR_SAME_IPS, DELETE_POD),
    FindingDoc("mac-changed", "same name, another MAC: someone made a new link", ROUND, REPAIR_SAME_IPS, DELETE_POD),
    FindingDoc("link-down", "the interface is administratively down", ROUND, REPAIR_SAME_IPS, DELETE_POD),
    FindingDoc("no-carrier", "up without carrier (its peer is down)", ROUND, REPAIR_SAME_IPS, DELETE_POD),
    FindingDoc("address-missing", "an address of the result is not on the interface", ROUND, REPAIR_SAME_IPS,
               DELETE_POD),
    FindingDoc("address-extra", "a static global address nobody expected", ROUND, REPAIR_SAME_IPS, DELETE_POD),
    FindingDoc("route-missing", "a route of the result is not in the pod's netns through its interface", ROUND,
               REPAIR_SAME_IPS, DELETE_POD),
    FindingDoc("dnat-missing", "portmap's DNAT rule for a hostPort is gone (iptables or nft; a firewall reload)",
               ROUND + " (the rules are read once a round for every pod)", REPAIR_SAME_IPS, DELETE_POD),
    FindingDoc("masq-missing", "the masquerade rule the bridge (or ptp) plugin made for an address with ipMasq is "
               "gone (iptables or nft; a firewall reload)", ROUND + " (the rules are read once a round for every pod)",
               REPAIR_SAME_IPS, DELETE_POD),
    FindingDoc("lease-missing", "host-local's lease file of an address is gone, or names another container (the "
               "address could be handed out twice)", ROUND + " (the leases are read once a round)",
               REPAIR_SAME_IPS + "; if another pod holds the address: broken ip-taken", DELETE_POD),
    FindingDoc("unreadable", "the pod's netns, its routes, the host's links, DNAT or masquerade rules or leases could "
               "not be read: not verified, never ok",
               ROUND + "; read again every round", "nothing (never on a guess); the pod: broken unreadable",
               "if it stays: the daemon log says what failed; delete the pod"),
    FindingDoc("no-result", "nri-cni's cache entry holds no result: nothing to compare with", ROUND,
               "nothing (the IPs are unknown); the pod: broken unreadable", "delete the pod"),
    FindingDoc("bad-result", "the cached result cannot be read", ROUND,
               "nothing (the IPs are unknown); the pod: broken unreadable", "delete the pod"),
    FindingDoc("check-failed", "the chain's CNI CHECK failed (what netlink cannot judge)",
               "every verify.check_every rounds (5 min), at once when netlink finds a difference, "
               "nri-cni verify --check", REPAIR_SAME_IPS, DELETE_POD),
    FindingDoc("missing", "a network the pod should have is not attached", ROUND,
               "ADD it (shim, secondary; native only with IPs the runtime lists); else broken missed",
               DELETE_POD),
    FindingDoc("netns-unreadable", "the runtime lists the pod and its pause runs, but its netns path is gone or "
               "no network namespace", ROUND, "nothing: nothing is released, its IPs stay held (broken "
               "netns-unreadable)", "delete the pod; its networks are released when the runtime drops it"),
)  # fmt: skip
BROKEN_CODES = (
    FindingDoc("ip-taken", "the IP the pod must get back belongs to another pod", ROUND,
               "never takes it", "delete the pod (it gets a new IP)"),
    FindingDoc("repair-failed", "repairs kept failing (retried with backoff)", "after 3 failed repairs",
               "retried with backoff", "fix what the error names, then nri-cni verify --pod, or delete the pod"),
    FindingDoc("missed", "native mode: the runtime made the pod without nri-cni's answer (down, killed, or "
               "answered past the NRI request timeout)", "at once for a late answer; else the verify after "
               "Synchronize", "releases what a late answer attached; attaches nothing the runtime would not "
               "report", "delete the pod; for the deadline, raise the runtime's plugin_request_timeout"),
    FindingDoc("repair-off", "it differs and repair is off or verify-only", ROUND, "nothing",
               "repair it by hand, set repair: on, or delete the pod"),
    FindingDoc("netns-unreadable", "see the finding of that name", ROUND, "nothing", "delete the pod"),
    FindingDoc("unreadable", "part of what the pod needs could not be read or compared", ROUND,
               "nothing; read again every round", "if it stays: the daemon log; delete the pod"),
    FindingDoc("ips-not-requestable", "its IPs must come back and no plugin of its chain can be asked for an "
               "address (no `ips` capability, no IPAM reading args.cni.ips)", ROUND, "nothing is cut",
               "declare the ips capability on a plugin whose IPAM honours it, or delete the pod"),
    FindingDoc("torn-down", "the runtime deleted the pod's network (shim mode: through the shim; secondary: its "
               "own) and, restarted in the middle of that stop (or of its creation), lists it READY without an IP",
               "the verify after the runtime's Synchronize",
               "nothing: a new ADD would give it IPs the runtime never reports", "delete the pod"),
    FindingDoc("del-failed", "its DEL fails (stop, remove, or GC once the runtime dropped it): nri-cni still "
               "holds its networks", "at the first failed DEL", "retried by the runtime's stop and every GC; "
               "gone once a DEL succeeds", "fix what the error names; nri-cni gc releases it"),
)  # fmt: skip


def kinds_table() -> str:
    """`nri-cni verify --kinds`: every attachment finding, then every broken code."""
    rows = [("FINDING", "WHAT", "NOTICED", "REPAIR", "ADMIN")]
    rows += [(f.kind, f.what, f.noticed, f.repair, f.admin) for f in FINDINGS]
    rows += [("BROKEN CODE", "", "", "", "")]
    rows += [(f.kind, f.what, f.noticed, f.repair, f.admin) for f in BROKEN_CODES]
    return "\n".join(" | ".join(r) for r in rows)
