"""Host-side network state for the end-to-end tests: a bridge CNI network for containerd
and the janitor that puts the host back the way the test found it.

The bridge plugin with ``isGateway`` turns on ``net.ipv4.ip_forward``; portmap adds nat
chains (per pod ``CNI-DN-*`` plus the shared ``CNI-HOSTPORT-*``, which it never removes) and,
through iptables-nft, the ``ip nat`` nft table. Only what this test's network created is
removed: rules that name its network, chains they jump to, shared chains and tables that did
not exist before and are now unused.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import secrets
import shlex
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.conflists import bridge_conflist, host_local, portmap
from tests.support.containerd import CNI_RESULTS_DIR

SYS_NET = Path("/sys/class/net")
IP_FORWARD = Path("/proc/sys/net/ipv4/ip_forward")
HOST_LOCAL_BOOKKEEPING = re.compile(r"^(lock|last_reserved_ip\..*)$")


def run(*cmd: str, check: bool = True) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout


def link_exists(name: str) -> bool:
    return (SYS_NET / name).exists()


def bridge_ports(bridge: str) -> list[str]:
    try:
        return sorted(os.listdir(SYS_NET / bridge / "brif"))
    except FileNotFoundError:
        return []


def nat_lines() -> list[str]:
    return run("iptables-save", "-t", "nat").splitlines()


def nft_tables() -> set[str]:
    return {line.strip() for line in run("nft", "list", "tables").splitlines() if line.strip()}


def netns_addrs(netns_path: str, ifname: str = "eth0") -> list[str]:
    """IPv4/IPv6 addresses (with prefix) of ``ifname`` inside the netns at ``netns_path``."""
    out = run("nsenter", f"--net={netns_path}", "ip", "-j", "addr", "show", "dev", ifname)
    return [
        f"{a['local']}/{a['prefixlen']}"
        for link in json.loads(out)
        for a in link.get("addr_info", [])
        if a.get("scope") != "link"
    ]


def netns_ipv4_addrs(netns_path: str, ifname: str) -> list[str]:
    """The IPv4 addresses (with prefix) of ``ifname`` inside the netns; none if it is missing."""
    out = run("nsenter", f"--net={netns_path}", "ip", "-o", "-4", "addr", "show", "dev", ifname, check=False)
    return [line.split()[3] for line in out.splitlines()]


def netns_reaches(netns_path: str, ip: str) -> bool:
    """Pings until the first answer, for up to ~60 s (IPv6: DAD on both ends, and a peer's
    neighbour entry for a re-made interface waits out its NUD probes)."""
    for _ in range(30):
        ping = subprocess.run(
            ["nsenter", f"--net={netns_path}", "ping", "-c", "1", "-W", "2", ip], capture_output=True
        )
        if ping.returncode == 0:
            return True
    return False


def netns_routes(netns_path: str) -> list[str]:
    """IPv4 and IPv6 routes inside the netns at ``netns_path``, one line each."""
    out = []
    for family in ("-4", "-6"):
        out += run(
            "nsenter", f"--net={netns_path}", "ip", family, "route", "show", "table", "all"
        ).splitlines()
    return [line for line in out if line.strip()]


def cni_cache_files(pod_id: str) -> list[Path]:
    return sorted(CNI_RESULTS_DIR.glob(f"*-{pod_id}-*"))


@dataclass
class BridgeNetwork:
    """A bridge + host-local (+ portmap) network list in its own conf dir."""

    tmpdir: Path
    bridge: str = "nctbr0"
    subnet: str = "10.246.0.0/24"
    portmap: bool = True
    name: str = field(default_factory=lambda: f"nct-e2e-{secrets.token_hex(3)}")
    conf_dir: Path = field(init=False)
    ipam_dir: Path = field(init=False)
    _before_nat: list[str] = field(init=False, default_factory=list)
    _before_nft: set[str] = field(init=False, default_factory=set)
    _ip_forward: str = field(init=False, default="0")

    def __post_init__(self) -> None:
        net = ipaddress.ip_network(self.subnet)
        if not net.subnet_of(ipaddress.ip_network("10.246.0.0/16")):
            raise ValueError(f"{self.subnet} is outside 10.246.0.0/16")
        if not self.bridge.startswith("nct"):
            raise ValueError(f"link name {self.bridge} must start with nct")
        if link_exists(self.bridge):
            raise RuntimeError(f"{self.bridge} already exists (left over, or used by another test right now)")
        self.conf_dir = self.tmpdir / "net.d"
        self.ipam_dir = self.tmpdir / "host-local"
        self.conf_dir.mkdir(parents=True)
        # made here with an address of its own: a bridge the plugin makes takes its ports' lowest
        # MAC, which changes while the first pods are added at once, and the bridge plugin's
        # CHECK (CRI-O runs one after every ADD) fails "Bridge interface ... Mac doesn't match"
        # for a pod whose result still has the old one. A set address never changes.
        run("ip", "link", "add", "name", self.bridge, "type", "bridge")
        mac = "02:" + ":".join(secrets.token_hex(1) for _ in range(5))
        run("ip", "link", "set", self.bridge, "address", mac, "up")
        self._before_nat = nat_lines()
        self._before_nft = nft_tables()
        self._ip_forward = IP_FORWARD.read_text().strip()
        # host-local without "routes": the pods get no default route
        ipam = host_local(self.ipam_dir, self.subnet)
        then = [portmap(snat=False)] if self.portmap else []
        self.conflist = bridge_conflist(self.name, self.bridge, ipam, version="1.0.0", then=then)
        (self.conf_dir / "10-nct-e2e.conflist").write_text(json.dumps(self.conflist, indent=2))

    @property
    def network(self) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
        return ipaddress.ip_network(self.subnet)

    @property
    def gateway(self) -> str:
        return str(next(self.network.hosts()))

    def reservations(self) -> dict[str, str]:
        """host-local's reservations: reserved IP -> "<container id> <ifname>" as in its file."""
        d = self.ipam_dir / self.name
        if not d.is_dir():
            return {}
        return {
            p.name: " ".join(p.read_text().split())
            for p in d.iterdir()
            if not HOST_LOCAL_BOOKKEEPING.match(p.name)
        }

    def nat_rules_for(self, marker: str) -> list[str]:
        return [line for line in nat_lines() if marker in line]

    def cleanup(self) -> list[str]:
        problems: list[str] = []
        # links: ports still on the bridge (pods whose netns survived), then the bridge
        for port in bridge_ports(self.bridge):
            if port.startswith("veth") or port.startswith("nct"):
                run("ip", "link", "del", port, check=False)
        if link_exists(self.bridge):
            try:
                run("ip", "link", "del", self.bridge)
            except RuntimeError as exc:
                problems.append(str(exc))
        problems += self._cleanup_nat()
        try:
            if IP_FORWARD.read_text().strip() != self._ip_forward:
                IP_FORWARD.write_text(self._ip_forward + "\n")
        except OSError as exc:
            problems.append(f"restore ip_forward: {exc}")
        return problems

    def _cleanup_nat(self) -> list[str]:
        problems: list[str] = []
        before = set(self._before_nat)
        now = nat_lines()
        # 1. rules naming this network, and the per-pod chains they jump to
        ours = [ln for ln in now if ln.startswith("-A ") and f'\\"{self.name}\\"' in ln]
        chains = {m.group(1) for ln in ours for m in [re.search(r"-j (CNI-DN-\S+)", ln)] if m}
        for ln in ours:
            self._iptables_delete(ln, problems)
        for chain in sorted(chains):
            run("iptables", "-t", "nat", "-F", chain, check=False)
            run("iptables", "-t", "nat", "-X", chain, check=False)
        # 2. portmap's shared chains, if this test brought them and no pod uses them now
        now = nat_lines()
        if any(ln.startswith("-A CNI-HOSTPORT-DNAT ") for ln in now):
            return problems
        shared = [
            c
            for c in ("CNI-HOSTPORT-DNAT", "CNI-HOSTPORT-SETMARK", "CNI-HOSTPORT-MASQ")
            if any(ln.startswith(f":{c} ") for ln in now)
            and not any(ln.startswith(f":{c} ") for ln in before)
        ]
        for ln in now:
            if ln.startswith("-A ") and ln not in before and any(f"-j {c}" in ln for c in shared):
                self._iptables_delete(ln, problems)
        for c in shared:
            run("iptables", "-t", "nat", "-F", c, check=False)
            run("iptables", "-t", "nat", "-X", c, check=False)
        # 3. the nft table iptables-nft made, if it is new and holds no rules
        for table in nft_tables() - self._before_nft:
            family_name = table.split()[1:]
            if family_name != ["ip", "nat"]:
                continue
            listing = run("nft", "-j", "list", "table", "ip", "nat", check=False)
            try:
                items = json.loads(listing)["nftables"]
            except (ValueError, KeyError):
                continue
            if not any("rule" in item for item in items):
                run("nft", "delete", "table", "ip", "nat", check=False)
        if any(f'\\"{self.name}\\"' in ln for ln in nat_lines()):
            problems.append(f"nat rules naming {self.name} remain")
        return problems

    @staticmethod
    def _iptables_delete(rule_line: str, problems: list[str]) -> None:
        # an iptables-save line "-A CHAIN args..." -> "iptables -t nat -D CHAIN args..."
        args = shlex.split(rule_line)
        proc = subprocess.run(
            ["iptables", "-t", "nat", "-D", *args[1:]], capture_output=True, text=True, timeout=30
        )
        if proc.returncode != 0:
            problems.append(f"iptables -D {rule_line}: {proc.stderr.strip()}")
