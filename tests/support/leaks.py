"""The leak checker: compares a snapshot taken before a test's ADD with one taken after its DEL.

Because other tests may run at the same time, it only reports new things that can be tied to
this test: host links it was told about or learned (enslaved to a tracked bridge, or the peer of
a link inside a tracked namespace), non-loopback links left in tracked namespaces, new files in
tracked directories (host-local dataDir, CNI cache dir, tuning dataDir), and new iptables / nft
lines that mention one of the test's markers (container ID, pod IP, network name) or a chain that
such a line jumps to.
"""

from __future__ import annotations

import fnmatch
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from tests.support.firewall import IPT_TARGET, NFT_TARGET, iptables_lines, marker_re, nft_lines
from tests.support.hostlocal import HOST_LOCAL_BOOKKEEPING
from tests.support.names import NetTestError
from tests.support.netns import NETNS_DIR, LinkInfo, Netns, list_links, netnsid_of

# Where nri-cni's daemon renames a file it removes, to unlink it there on a worker thread a
# moment later (nri_cni/safety/files.py remove_soon): the cache's deleted entries, the cleared
# intent records. A file there is a leak only if it stays; TRASH_WAIT bounds the wait for it.
TRASH_DIRS = ("results-deleted", "intents-cleared")
TRASH_WAIT = 60.0


def list_files(root: str | os.PathLike) -> set[str]:
    """Relative paths of the regular files (and symlinks) under `root` (empty if it is missing)."""
    root = Path(root)
    out: set[str] = set()
    if not root.exists():
        return out
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            out.add(os.path.relpath(os.path.join(dirpath, f), root))
    return out


@dataclass
class Snapshot:
    host_links: dict[str, LinkInfo]
    netns_names: set[str]
    files: dict[str, set[str]]
    iptables: set[str]
    nft: set[str]


class LeakChecker:
    """Finds what a test left behind, among the things that can be tied to it.

    markers      strings that identify the test's objects in firewall rules (container IDs, pod
                 IPs, network names); chains that a marked rule jumps to are learned as markers.
    dirs         directories whose new files are leaks (cache dir, host-local dataDir, ...).
    ignore_files glob patterns (matched against the file's basename) that are not leaks;
                 host-local's "lock" and "last_reserved_ip.*" by default.
    netns        namespaces that must hold no link but "lo" (and `netns_allowed`) at check time.
    host_links   host link names that must be gone at check time.
    bridges      host bridges whose new ports are tracked (a leftover port is a leak).
    """

    def __init__(
        self,
        *,
        markers: Iterable[str] = (),
        dirs: Iterable[str | os.PathLike] = (),
        ignore_files: Iterable[str] = HOST_LOCAL_BOOKKEEPING,
        netns: Iterable[Netns] = (),
        netns_allowed: Iterable[str] = ("lo",),
        host_links: Iterable[str] = (),
        bridges: Iterable[str] = (),
        firewall: bool = True,
    ) -> None:
        self.markers: set[str] = set(markers)
        self.dirs = [str(d) for d in dirs]
        self.ignore_files = tuple(ignore_files)
        self.netns = list(netns)
        self.netns_allowed = set(netns_allowed)
        self.host_links: set[str] = set(host_links)
        self.bridges = set(bridges)
        self.firewall = firewall
        self.base: Snapshot | None = None

    # -- snapshots

    def snapshot(self) -> Snapshot:
        links = {li.name: li for li in list_links()}
        try:
            names = set(os.listdir(NETNS_DIR))
        except FileNotFoundError:
            names = set()
        files = {d: {f for f in list_files(d) if not self._ignored(f)} for d in self.dirs}
        ipt = set(iptables_lines()) if self.firewall else set()
        nft = set(nft_lines()) if self.firewall else set()
        return Snapshot(links, names, files, ipt, nft)

    def _ignored(self, relpath: str) -> bool:
        base = os.path.basename(relpath)
        return any(fnmatch.fnmatch(base, pat) for pat in self.ignore_files)

    def start(self) -> LeakChecker:
        """Take the baseline (before the ADD under test)."""
        self.base = self.snapshot()
        return self

    def add_markers(self, *markers: str) -> None:
        self.markers.update(m for m in markers if m)

    def learn(self) -> Snapshot:
        """Look at the state while the attachment exists (after ADD) and remember what is ours:
        chains jumped to from marked rules, and new host links tied to our namespaces or bridges."""
        if self.base is None:
            raise NetTestError("LeakChecker.learn() before start()")
        now = self.snapshot()
        # chains: iterate, since a learned chain can jump to further chains
        while True:
            rx = marker_re(self.markers)
            if rx is None:
                break
            found: set[str] = set()
            for line in now.iptables - self.base.iptables:
                if rx.search(line):
                    found.update(t for t in IPT_TARGET.findall(line) if self._is_ipt_chain(now, line, t))
            for line in now.nft - self.base.nft:
                if rx.search(line):
                    found.update(NFT_TARGET.findall(line))
            if found <= self.markers:
                break
            self.markers |= found
        # links
        ours_nsids = set()
        for ns in self.netns:
            if ns.exists():
                nsid = netnsid_of(ns)
                if nsid is not None:
                    ours_nsids.add(nsid)
        bridge_idx = {now.host_links[b].index for b in self.bridges if b in now.host_links}
        for name, li in now.host_links.items():
            if name in self.base.host_links:
                continue
            if li.master in bridge_idx or (li.link_netnsid is not None and li.link_netnsid in ours_nsids):
                self.host_links.add(name)
        return now

    @staticmethod
    def _is_ipt_chain(snap: Snapshot, line: str, target: str) -> bool:
        fam, table = line.split(" ", 2)[:2]
        decl = f"{fam} {table} :{target} "
        return any(x.startswith(decl) for x in snap.iptables)

    # -- verdict

    def leaks(self) -> list[str]:
        """Human-readable leaks; empty when the test left nothing behind."""
        if self.base is None:
            raise NetTestError("LeakChecker.leaks() before start()")
        self._wait_for_trash()
        now = self.snapshot()
        out: list[str] = []
        for name in sorted(self.host_links):
            if name in now.host_links:
                out.append(f"host link {name} still exists")
        bridge_idx = {now.host_links[b].index: b for b in self.bridges if b in now.host_links}
        for name, li in sorted(now.host_links.items()):
            if name not in self.base.host_links and li.master in bridge_idx and name not in self.host_links:
                out.append(f"host link {name} still enslaved to {bridge_idx[li.master]}")
        for ns in self.netns:
            if not ns.exists():
                continue
            extra = [li.name for li in ns.links() if li.name not in self.netns_allowed]
            if extra:
                out.append(f"netns {ns.name} still has links {extra}")
        rx = marker_re(self.markers)
        if rx is not None:
            for name in sorted(now.netns_names - self.base.netns_names):
                if rx.search(name):
                    out.append(f"netns {name} left behind")
        for d in self.dirs:
            for f in sorted(now.files.get(d, set()) - self.base.files.get(d, set())):
                out.append(f"file {os.path.join(d, f)} left behind")
        if rx is not None:
            for line in sorted(now.iptables - self.base.iptables):
                if rx.search(line):
                    out.append(f"iptables: {line}")
            for line in sorted(now.nft - self.base.nft):
                if rx.search(line):
                    out.append(f"nft: {line}")
        return out

    def _wait_for_trash(self) -> None:
        """Until no new file of the tracked directories is in a TRASH_DIRS directory (the
        daemon's worker unlinks it), or TRASH_WAIT passed (then it is reported)."""
        assert self.base is not None
        base = self.base.files
        deadline = time.monotonic() + TRASH_WAIT
        while time.monotonic() < deadline:
            new = (f for d in self.dirs for f in list_files(d) - base.get(d, set()))
            if not any(set(f.split(os.sep)[:-1]).intersection(TRASH_DIRS) for f in new):
                return
            time.sleep(0.01)

    def assert_clean(self) -> None:
        leaks = self.leaks()
        assert not leaks, "leaked:\n  " + "\n  ".join(leaks)
