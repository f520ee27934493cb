"""The host's firewall rules as the CNI plugins leave them: the iptables and nft rulesets read
as comparable lines (what a test compares before and after), and the removal of what no DEL
removes: the plugins' shared chains once nothing uses them, left-over per-pod chains, and the
rules of a test that failed before its DEL (found by its markers). Each removal is one atomic
iptables-restore per table."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterable

from tests.support.names import NetTestError

_IPT_COUNTERS = re.compile(r"\s*\[\d+:\d+\]")
_NFT_COUNTERS = re.compile(r"counter packets \d+ bytes \d+")
IPT_TARGET = re.compile(r"\s-[jg]\s+(\S+)")
NFT_TARGET = re.compile(r"\b(?:jump|goto)\s+(\S+)")


def marker_re(markers: Iterable[str]) -> re.Pattern | None:
    """A pattern that finds any of `markers` as a whole word in a rule (None for no markers)."""
    ms = sorted({m for m in markers if m}, key=len, reverse=True)
    if not ms:
        return None
    alt = "|".join(re.escape(m) for m in ms)
    # not part of a longer name, number or address
    return re.compile(rf"(?<![\w.\-])(?:{alt})(?![\w\-]|\.\d)")


def iptables_lines() -> list[str]:
    """`iptables-save` and `ip6tables-save`, normalised: one "<fam> <table> <line>" per rule or
    chain declaration, without comments and counters."""
    out: list[str] = []
    for fam, tool in (("v4", "iptables-save"), ("v6", "ip6tables-save")):
        exe = shutil.which(tool)
        if exe is None:
            raise NetTestError(f"{tool} not found on PATH")
        text = subprocess.run([exe], capture_output=True, text=True, check=True, timeout=30).stdout
        table = ""
        for line in text.splitlines():
            line = line.strip()
            if not line or line.startswith("#") or line == "COMMIT":
                continue
            if line.startswith("*"):
                table = line[1:]
                continue
            if line.startswith(":"):
                line = _IPT_COUNTERS.sub("", line)
            out.append(f"{fam} {table} {line}")
    return out


def nft_lines() -> list[str]:
    """`nft list ruleset`, flattened: each line prefixed with its enclosing blocks, no counters."""
    exe = shutil.which("nft")
    if exe is None:
        raise NetTestError("nft not found on PATH")
    text = subprocess.run(
        [exe, "-s", "list", "ruleset"], capture_output=True, text=True, check=True, timeout=30
    ).stdout
    out: list[str] = []
    stack: list[str] = []
    for raw in text.splitlines():
        line = _NFT_COUNTERS.sub("counter", raw.strip())
        if not line:
            continue
        if line.endswith("{"):
            stack.append(line[:-1].strip())
            out.append(" / ".join(stack))
            continue
        if line == "}":
            if stack:
                stack.pop()
            continue
        out.append(" / ".join(stack + [line]))
    return out


#: Chains the reference plugins create once and never remove (firewall, portmap), which hold no
#: per-pod rule once every attachment is gone.
CNI_SCAFFOLD_CHAINS = (
    "CNI-FORWARD",
    "CNI-ADMIN",
    "CNI-HOSTPORT-DNAT",
    "CNI-HOSTPORT-SETMARK",
    "CNI-HOSTPORT-MASQ",
)


def remove_cni_scaffolding(baseline: Iterable[str]) -> list[str]:
    """Remove the shared plugin chains (and the jumps into them) that are not in `baseline` (an
    earlier `iptables_lines()`), table by table in one atomic iptables-restore, and only while
    they hold nothing but each other: a chain someone else is using right now stays (the
    restore fails as a whole when a chain is not empty). Returns the chains removed."""
    baseline = set(baseline)
    now = iptables_lines()
    removed: list[str] = []
    tables = sorted({tuple(line.split(" ", 2)[:2]) for line in now})
    for fam, table in tables:
        prefix = f"{fam} {table} "
        lines = [ln[len(prefix) :] for ln in now if ln.startswith(prefix)]
        declared = {ln[1:].split(" ", 1)[0] for ln in lines if ln.startswith(":")}
        new_chains = {
            ln[1:].split(" ", 1)[0] for ln in lines if ln.startswith(":") and prefix + ln not in baseline
        } & set(CNI_SCAFFOLD_CHAINS)
        if not new_chains:
            continue
        rules, in_use = [], False
        for ln in lines:
            if not ln.startswith("-A "):
                continue
            chain = ln.split(" ", 2)[1]
            # jumps to other chains of the table; a built-in target (MASQUERADE, MARK) is not one
            targets = set(IPT_TARGET.findall(" " + ln)) & declared
            if chain in new_chains:
                if not targets <= new_chains:
                    in_use = True  # a jump to a per-pod chain: someone's pod still uses it
                rules.append(ln)
            elif targets & new_chains:
                rules.append(ln)
        if in_use:
            continue
        if _restore(fam, table, rules, (), new_chains).returncode == 0:
            removed += [f"{fam} {table} {c}" for c in sorted(new_chains)]
    return removed


_CNI_CHAIN = re.compile(r"^(v4|v6) (\w+) :(CNI-[A-Za-z0-9_-]+) ")


def pod_chains() -> set[tuple[str, str, str]]:
    """(family, table, chain) of every CNI chain that is not shared scaffolding: the per-pod
    ones (portmap's CNI-DN-/CNI-SN-<hash>, bridge ipMasq's CNI-<hash>)."""
    return {
        m.groups()
        for ln in iptables_lines()
        if (m := _CNI_CHAIN.match(ln)) and m.group(3) not in CNI_SCAFFOLD_CHAINS
    }


def remove_chains(chains: Iterable[tuple[str, str, str]]) -> list[str]:
    """Deletes these chains and every rule that jumps to them (one iptables-restore per table);
    returns the rules deleted and the chains, as text for a report."""
    chains = set(chains)
    now = iptables_lines()
    report: list[str] = []
    for fam, table in sorted({(f, t) for f, t, _ in chains}):
        names = {c for f, t, c in chains if (f, t) == (fam, table)}
        prefix = f"{fam} {table} "
        rules = [ln[len(prefix) :] for ln in now if ln.startswith(prefix + "-A ")]
        jumps = [
            r for r in rules if set(IPT_TARGET.findall(" " + r)) & names and r.split(" ", 2)[1] not in names
        ]
        own = [r for r in rules if r.split(" ", 2)[1] in names]
        _restore(fam, table, jumps, names, names)
        report += [f"{fam} {table} {r}" for r in jumps + own]
    return report


def purge_firewall_rules(markers: Iterable[str]) -> list[str]:
    """Safety net for a test that failed before its DEL: delete every iptables rule that
    mentions one of `markers` (container IDs, pod IPs, network names), the rules of the chains
    such rules jump to, and those chains. One atomic iptables-restore per table; returns the
    rules deleted. Never touches a rule without a marker (or outside a marked chain)."""
    rx = marker_re(markers)
    if rx is None:
        return []
    now = iptables_lines()
    deleted: list[str] = []
    for fam, table in sorted({tuple(line.split(" ", 2)[:2]) for line in now}):
        prefix = f"{fam} {table} "
        lines = [ln[len(prefix) :] for ln in now if ln.startswith(prefix)]
        declared = {ln[1:].split(" ", 1)[0] for ln in lines if ln.startswith(":")}
        chains: set[str] = set()
        while True:  # chains jumped to from marked rules, transitively
            crx = marker_re(chains)
            grown = set(chains)
            for ln in lines:
                if ln.startswith("-A ") and (rx.search(ln) or (crx and crx.search(ln))):
                    grown |= {t for t in IPT_TARGET.findall(" " + ln) if t in declared}
            if grown == chains:
                break
            chains = grown
        crx = marker_re(chains)
        rules = [ln for ln in lines if ln.startswith("-A ") and (rx.search(ln) or (crx and crx.search(ln)))]
        if not rules and not chains:
            continue
        p = _restore(fam, table, rules, (), chains)
        if p.returncode != 0:
            raise NetTestError(f"{p.args[0]} could not purge {rules}: {p.stderr.strip()}")
        deleted += [f"{fam} {table} {r}" for r in rules]
    return deleted


def _restore(
    fam: str, table: str, rules: Iterable[str], flush: Iterable[str], delete: Iterable[str]
) -> subprocess.CompletedProcess[str]:
    """One atomic `iptables-restore --noflush` (ip6tables- for v6) of `table`: deletes `rules`
    (as iptables-save lists them, "-A chain ..."), then flushes and deletes the chains named."""
    script = (
        [f"*{table}"]
        + ["-D " + r[3:] for r in rules]
        + [f"-F {c}" for c in sorted(flush)]
        + [f"-X {c}" for c in sorted(delete)]
        + ["COMMIT", ""]
    )
    tool = "iptables-restore" if fam == "v4" else "ip6tables-restore"
    return subprocess.run(
        [tool, "--noflush"], input="\n".join(script), capture_output=True, text=True, timeout=30
    )
