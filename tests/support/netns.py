"""Network test helpers: namespaces, veths and bridges that are always cleaned up, and a leak checker.

Everything here is meant to be shared by the tests that run real CNI plugins (tests/integration) and
the pod-networking tests. Rules it follows (see the project brief):

* every name it makes starts with ``nct`` and carries a random suffix, so tests can run in parallel
  with other tests on the same machine;
* everything made through a :class:`Janitor` is removed by ``Janitor.cleanup()`` in reverse order,
  even when some removals fail (errors are collected and returned, never hide the rest);
* nothing it did not create is ever deleted.

Typical use in a pytest fixture::

    jan = Janitor()
    request.addfinalizer(jan.cleanup_or_raise)
    ns = jan.netns()
    br = jan.bridge(addr="10.247.3.1/24")
    host, peer = jan.veth(peer_netns=ns)

The leak checker (:class:`LeakChecker`) compares a snapshot taken before a test's ADD with one
taken after its DEL. Because other tests may run at the same time, it only reports new things that
can be tied to this test: host links it was told about or learned (enslaved to a tracked bridge, or
the peer of a link inside a tracked namespace), non-loopback links left in tracked namespaces,
new files in tracked directories (host-local dataDir, CNI cache dir, tuning dataDir), and new
iptables / nft lines that mention one of the test's markers (container ID, pod IP, network name)
or a chain that such a line jumps to.
"""

from __future__ import annotations

import errno
import fnmatch
import ipaddress
import os
import random
import re
import shutil
import subprocess
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from pyroute2 import IPRoute
from pyroute2 import netns as _pr_netns

NETNS_DIR = "/var/run/netns"
NAME_PREFIX = "nct"
IFNAMSIZ = 15

#: The subnets tests may use (the brief: 10.247.0.0/16 .. 10.249.0.0/16).
TEST_SUPERNETS = tuple(ipaddress.ip_network(f"10.{b}.0.0/16") for b in (247, 248, 249))

#: Files host-local keeps in its per-network directory that are not reservations.
HOST_LOCAL_BOOKKEEPING = ("lock", "last_reserved_ip.*")


class NetTestError(RuntimeError):
    """A helper could not do what it was asked (the message says what and why)."""


# --------------------------------------------------------------------------------------------
# names and subnets


def unique_name(tag: str = "", *, length: int = IFNAMSIZ) -> str:
    """A fresh name ``nct<tag><random hex>`` of at most `length` characters (an ifname by default).

    At least 6 random hex digits are kept, so `tag` is cut when it is too long.
    """
    room = length - len(NAME_PREFIX)
    if room < 6:
        raise ValueError("length too small for a unique name")
    tag = tag[: max(0, room - 6)]
    return NAME_PREFIX + tag + "".join(random.choice("0123456789abcdef") for _ in range(room - len(tag)))


def _used_ipv4_networks() -> list[ipaddress.IPv4Network]:
    """Networks routed or addressed on the host (and in every named netns), to avoid collisions."""
    used: list[ipaddress.IPv4Network] = []
    with IPRoute() as ipr:
        for msg in ipr.get_addr(family=2):
            used.append(ipaddress.ip_interface(f"{msg.get('IFA_ADDRESS')}/{msg['prefixlen']}").network)
        for msg in ipr.get_routes(family=2, table=254):
            dst = msg.get("RTA_DST")
            if dst:
                used.append(ipaddress.ip_network(f"{dst}/{msg['dst_len']}", strict=False))
    return used


def free_subnet(prefixlen: int = 24, *, exclude: Iterable[str] = ()) -> ipaddress.IPv4Network:
    """A random subnet of the test ranges that no host address or route overlaps right now."""
    used = _used_ipv4_networks() + [ipaddress.ip_network(x) for x in exclude]
    candidates = [n for sup in TEST_SUPERNETS for n in sup.subnets(new_prefix=prefixlen)]
    random.shuffle(candidates)
    for net in candidates:
        if not any(net.overlaps(u) for u in used):
            return net
    raise NetTestError(f"no free /{prefixlen} left in the test ranges")


# --------------------------------------------------------------------------------------------
# reading links


@dataclass
class LinkInfo:
    """What netlink says about one link (enough for tests to compare with a CNI result)."""

    name: str
    index: int
    kind: str
    mac: str
    mtu: int
    up: bool
    addrs: list[str] = field(default_factory=list)  # "ip/prefixlen"
    master: int | None = None
    link_netnsid: int | None = None
    peer_index: int | None = None  # IFLA_LINK (veth peer index, macvlan master index)

    def has_addr(self, cidr: str) -> bool:
        want = ipaddress.ip_interface(cidr)
        return any(ipaddress.ip_interface(a) == want for a in self.addrs)


def _ipr(netns: str | Netns | None) -> IPRoute:
    if netns is None:
        return IPRoute()
    name = netns.name if isinstance(netns, Netns) else _netns_name(netns)
    return IPRoute(netns=name)


def _netns_name(ref: str) -> str:
    """A named netns from a name or a /var/run/netns path; any other path as it is (pyroute2
    takes a name or an absolute path: CRI-O pins netns under its namespaces_dir)."""
    if "/" in ref:
        p = Path(ref)
        if str(p.parent) not in (NETNS_DIR, "/run/netns"):
            return str(p)
        return p.name
    return ref


def _link_info(ipr: IPRoute, msg) -> LinkInfo:
    info = msg.get_attr("IFLA_LINKINFO")
    kind = (info.get_attr("IFLA_INFO_KIND") if info is not None else None) or ""
    idx = msg["index"]
    addrs = [f"{a.get_attr('IFA_ADDRESS')}/{a['prefixlen']}" for a in ipr.get_addr(index=idx)]
    return LinkInfo(
        name=msg.get_attr("IFLA_IFNAME"),
        index=idx,
        kind=kind,
        mac=(msg.get_attr("IFLA_ADDRESS") or "").lower(),
        mtu=msg.get_attr("IFLA_MTU") or 0,
        up=bool(msg["flags"] & 1),
        addrs=addrs,
        master=msg.get_attr("IFLA_MASTER"),
        link_netnsid=msg.get_attr("IFLA_LINK_NETNSID"),
        peer_index=msg.get_attr("IFLA_LINK"),
    )


def list_links(netns: str | Netns | None = None) -> list[LinkInfo]:
    """Every link of the host (netns None) or of a named namespace."""
    with _ipr(netns) as ipr:
        return [_link_info(ipr, m) for m in ipr.get_links()]


def get_link(name: str, netns: str | Netns | None = None) -> LinkInfo | None:
    """One link by name, or None if there is no such link."""
    with _ipr(netns) as ipr:
        idx = ipr.link_lookup(ifname=name)
        if not idx:
            return None
        try:
            return _link_info(ipr, ipr.get_links(idx[0])[0])
        except Exception as exc:  # vanished between lookup and get
            if getattr(exc, "code", None) == errno.ENODEV:
                return None
            raise


def link_exists(name: str, netns: str | Netns | None = None) -> bool:
    with _ipr(netns) as ipr:
        return bool(ipr.link_lookup(ifname=name))


def delete_link(name: str, netns: str | Netns | None = None) -> bool:
    """Delete a link if it exists; True if something was deleted."""
    with _ipr(netns) as ipr:
        idx = ipr.link_lookup(ifname=name)
        if not idx:
            return False
        try:
            ipr.link("del", index=idx[0])
        except Exception as exc:
            if getattr(exc, "code", None) == errno.ENODEV:
                return False
            raise
        return True


def list_routes(netns: str | Netns | None = None, family: int = 2) -> list[dict]:
    """Main-table routes as dicts {dst, gw, dev} (dst "default" for the default route)."""
    out = []
    with _ipr(netns) as ipr:
        names = {m["index"]: m.get_attr("IFLA_IFNAME") for m in ipr.get_links()}
        for r in ipr.get_routes(family=family, table=254):
            dst = r.get_attr("RTA_DST")
            out.append(
                {
                    "dst": f"{dst}/{r['dst_len']}" if dst else "default",
                    "gw": r.get_attr("RTA_GATEWAY") or "",
                    "dev": names.get(r.get_attr("RTA_OIF"), ""),
                }
            )
    return out


def netnsid_of(ns: Netns | str) -> int | None:
    """The id the host namespace has assigned to a named namespace (None if none yet)."""
    path = ns.path if isinstance(ns, Netns) else os.path.join(NETNS_DIR, _netns_name(ns))
    fd = os.open(path, os.O_RDONLY)
    try:
        with IPRoute() as ipr:
            r = ipr.get_netnsid(fd=fd)
        nsid = r.get("nsid") if isinstance(r, dict) else None
        return None if nsid is None or nsid < 0 else nsid
    finally:
        os.close(fd)


# --------------------------------------------------------------------------------------------
# namespaces


@dataclass(frozen=True)
class Netns:
    """A named network namespace (``/var/run/netns/<name>``)."""

    name: str

    @property
    def path(self) -> str:
        return os.path.join(NETNS_DIR, self.name)

    def exists(self) -> bool:
        return os.path.exists(self.path)

    def links(self) -> list[LinkInfo]:
        return list_links(self)

    def link(self, name: str) -> LinkInfo | None:
        return get_link(name, self)

    def routes(self, family: int = 2) -> list[dict]:
        return list_routes(self, family)

    def run(self, *argv: str, check: bool = True, timeout: float = 20) -> subprocess.CompletedProcess:
        """Run a command inside the namespace (``ip netns exec``)."""
        return subprocess.run(
            ["ip", "netns", "exec", self.name, *argv],
            capture_output=True,
            text=True,
            check=check,
            timeout=timeout,
        )

    def sysctl(self, key: str) -> str:
        """Read a sysctl (dotted or slashed key) inside the namespace."""
        path = "/proc/sys/" + key.replace(".", "/") if "/" not in key else "/proc/sys/" + key
        return self.run("cat", path).stdout.strip()


def create_netns(name: str | None = None) -> Netns:
    name = name or unique_name("ns")
    _pr_netns.create(name)
    ns = Netns(name)
    with _ipr(ns) as ipr:  # bring loopback up, as runtimes do
        ipr.link("set", index=ipr.link_lookup(ifname="lo")[0], state="up")
    return ns


def delete_netns(ns: Netns | str) -> bool:
    """Remove a named namespace if it exists; True if something was removed."""
    name = ns.name if isinstance(ns, Netns) else _netns_name(ns)
    if not os.path.exists(os.path.join(NETNS_DIR, name)):
        return False
    try:
        _pr_netns.remove(name)
    except FileNotFoundError:
        return False
    return True


# --------------------------------------------------------------------------------------------
# the janitor: makes things and undoes them


class Janitor:
    """Creates namespaces, links and files, and removes exactly those in ``cleanup()``.

    Order of cleanup is the reverse of creation. Removals that find the object already gone are
    fine (a DEL under test may have removed it). Every failure is collected, and cleanup goes on.
    """

    def __init__(self) -> None:
        self._undo: list[tuple[str, Callable[[], object]]] = []

    # -- registering arbitrary undo steps

    def defer(self, what: str, fn: Callable[[], object]) -> None:
        """Run `fn` at cleanup (last deferred runs first)."""
        self._undo.append((what, fn))

    def track_link(self, name: str, netns: Netns | str | None = None) -> None:
        """Delete link `name` at cleanup if it still exists (e.g. a bridge a CNI plugin made)."""
        self.defer(f"link {name}", lambda: delete_link(name, netns))

    def track_path(self, path: str | os.PathLike) -> None:
        """Remove a file or directory tree at cleanup."""
        p = Path(path)

        def rm() -> None:
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=False)
            elif p.exists() or p.is_symlink():
                p.unlink()

        self.defer(f"path {p}", rm)

    # -- making things

    def netns(self, name: str | None = None) -> Netns:
        ns = create_netns(name)
        self.defer(f"netns {ns.name}", lambda: delete_netns(ns))
        return ns

    def bridge(
        self, name: str | None = None, *, addr: str | None = None, up: bool = True, mtu: int | None = None
    ) -> str:
        name = name or unique_name("br")
        with IPRoute() as ipr:
            kw = {"mtu": mtu} if mtu else {}
            ipr.link("add", ifname=name, kind="bridge", **kw)
            self.track_link(name)
            idx = ipr.link_lookup(ifname=name)[0]
            if addr:
                iface = ipaddress.ip_interface(addr)
                ipr.addr("add", index=idx, address=str(iface.ip), prefixlen=iface.network.prefixlen)
            if up:
                ipr.link("set", index=idx, state="up")
        return name

    def veth(
        self,
        host_name: str | None = None,
        peer_name: str | None = None,
        *,
        peer_netns: Netns | None = None,
        master: str | None = None,
        up: bool = True,
        mtu: int | None = None,
    ) -> tuple[str, str]:
        """A veth pair: `host_name` stays on the host, `peer_name` goes to `peer_netns` if given."""
        host_name = host_name or unique_name("vh")
        peer_name = peer_name or unique_name("vp")
        peer: dict = {"ifname": peer_name}
        if peer_netns is not None:
            peer["net_ns_fd"] = peer_netns.name
        with IPRoute() as ipr:
            kw = {"mtu": mtu} if mtu else {}
            ipr.link("add", ifname=host_name, kind="veth", peer=peer, **kw)
            # deleting either end deletes the pair; the host end is the one we can always find
            self.track_link(host_name)
            idx = ipr.link_lookup(ifname=host_name)[0]
            if master:
                ipr.link("set", index=idx, master=ipr.link_lookup(ifname=master)[0])
            if up:
                ipr.link("set", index=idx, state="up")
        if up:
            with _ipr(peer_netns) as ipr:
                ipr.link("set", index=ipr.link_lookup(ifname=peer_name)[0], state="up")
        return host_name, peer_name

    def tmpdir(self, base: str | os.PathLike, name: str) -> Path:
        p = Path(base) / name
        p.mkdir(parents=True, exist_ok=False)
        self.track_path(p)
        return p

    # -- undoing

    def cleanup(self) -> list[str]:
        """Undo everything; returns the failures ("what: error"), empty when all went well."""
        errors: list[str] = []
        while self._undo:
            what, fn = self._undo.pop()
            try:
                fn()
            except Exception as exc:  # keep going: the rest must still be removed
                errors.append(f"{what}: {exc!r}")
        return errors

    def cleanup_or_raise(self) -> None:
        errors = self.cleanup()
        if errors:
            raise NetTestError("cleanup failed: " + "; ".join(errors))


# --------------------------------------------------------------------------------------------
# host-local reservations and file trees


@dataclass(frozen=True)
class Reservation:
    network: str
    ip: str
    container_id: str
    ifname: str


def host_local_reservations(data_dir: str | os.PathLike) -> list[Reservation]:
    """The addresses host-local holds under `data_dir` (its ``dataDir``), one per file.

    host-local names each file after the address and writes "<containerID>\\r\\n<ifname>" in it.
    """
    out: list[Reservation] = []
    root = Path(data_dir)
    if not root.is_dir():
        return out
    for netdir in sorted(p for p in root.iterdir() if p.is_dir()):
        for f in sorted(netdir.iterdir()):
            try:
                ipaddress.ip_address(f.name)
            except ValueError:
                continue
            try:
                lines = f.read_text().splitlines()
            except FileNotFoundError:  # released while we looked (a DEL running now)
                continue
            out.append(
                Reservation(
                    netdir.name,
                    f.name,
                    lines[0].strip() if lines else "",
                    lines[1].strip() if len(lines) > 1 else "",
                )
            )
    return out


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


# --------------------------------------------------------------------------------------------
# firewall rule snapshots

_IPT_COUNTERS = re.compile(r"\s*\[\d+:\d+\]")
_NFT_COUNTERS = re.compile(r"counter packets \d+ bytes \d+")
_IPT_TARGET = re.compile(r"\s-[jg]\s+(\S+)")
_NFT_TARGET = re.compile(r"\b(?:jump|goto)\s+(\S+)")


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


# --------------------------------------------------------------------------------------------
# the leak checker


def _marker_re(markers: Iterable[str]) -> re.Pattern | None:
    ms = sorted({m for m in markers if m}, key=len, reverse=True)
    if not ms:
        return None
    alt = "|".join(re.escape(m) for m in ms)
    # not part of a longer name, number or address
    return re.compile(rf"(?<![\w.\-])(?:{alt})(?![\w\-]|\.\d)")


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
            rx = _marker_re(self.markers)
            if rx is None:
                break
            found: set[str] = set()
            for line in now.iptables - self.base.iptables:
                if rx.search(line):
                    found.update(t for t in _IPT_TARGET.findall(line) if self._is_ipt_chain(now, line, t))
            for line in now.nft - self.base.nft:
                if rx.search(line):
                    found.update(_NFT_TARGET.findall(line))
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
        rx = _marker_re(self.markers)
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

    def assert_clean(self) -> None:
        leaks = self.leaks()
        assert not leaks, "leaked:\n  " + "\n  ".join(leaks)


# --------------------------------------------------------------------------------------------
# the plugins' shared chains

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
            targets = set(_IPT_TARGET.findall(" " + ln)) & declared
            if chain in new_chains:
                if not targets <= new_chains:
                    in_use = True  # a jump to a per-pod chain: someone's pod still uses it
                rules.append(ln)
            elif targets & new_chains:
                rules.append(ln)
        if in_use:
            continue
        script = (
            [f"*{table}"]
            + ["-D " + r[3:] for r in rules]
            + [f"-X {c}" for c in sorted(new_chains)]
            + ["COMMIT", ""]
        )
        tool = "iptables-restore" if fam == "v4" else "ip6tables-restore"
        p = subprocess.run(
            [tool, "--noflush"], input="\n".join(script), capture_output=True, text=True, timeout=30
        )
        if p.returncode == 0:
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
            r for r in rules if set(_IPT_TARGET.findall(" " + r)) & names and r.split(" ", 2)[1] not in names
        ]
        own = [r for r in rules if r.split(" ", 2)[1] in names]
        script = (
            [f"*{table}"]
            + ["-D " + r[3:] for r in jumps]
            + [f"-F {c}" for c in sorted(names)]
            + [f"-X {c}" for c in sorted(names)]
            + ["COMMIT", ""]
        )
        tool = "iptables-restore" if fam == "v4" else "ip6tables-restore"
        subprocess.run(
            [tool, "--noflush"], input="\n".join(script), capture_output=True, text=True, timeout=30
        )
        report += [f"{fam} {table} {r}" for r in jumps + own]
    return report


def purge_firewall_rules(markers: Iterable[str]) -> list[str]:
    """Safety net for a test that failed before its DEL: delete every iptables rule that
    mentions one of `markers` (container IDs, pod IPs, network names), the rules of the chains
    such rules jump to, and those chains. One atomic iptables-restore per table; returns the
    rules deleted. Never touches a rule without a marker (or outside a marked chain)."""
    rx = _marker_re(markers)
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
            crx = _marker_re(chains)
            grown = set(chains)
            for ln in lines:
                if ln.startswith("-A ") and (rx.search(ln) or (crx and crx.search(ln))):
                    grown |= {t for t in _IPT_TARGET.findall(" " + ln) if t in declared}
            if grown == chains:
                break
            chains = grown
        crx = _marker_re(chains)
        rules = [ln for ln in lines if ln.startswith("-A ") and (rx.search(ln) or (crx and crx.search(ln)))]
        if not rules and not chains:
            continue
        script = (
            [f"*{table}"]
            + ["-D " + r[3:] for r in rules]
            + [f"-X {c}" for c in sorted(chains)]
            + ["COMMIT", ""]
        )
        tool = "iptables-restore" if fam == "v4" else "ip6tables-restore"
        p = subprocess.run(
            [tool, "--noflush"], input="\n".join(script), capture_output=True, text=True, timeout=30
        )
        if p.returncode != 0:
            raise NetTestError(f"{tool} could not purge {rules}: {p.stderr.strip()}")
        deleted += [f"{fam} {table} {r}" for r in rules]
    return deleted
