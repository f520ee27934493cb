"""What a pod needs on the host besides links, read once a round for every pod: portmap's DNAT
rules for its hostPorts, its plugin's masquerade of its addresses (ipMasq) and host-local's
leases of its addresses.

- DNAT: portmap's iptables backend makes, in the nat table, a rule in CNI-HOSTPORT-DNAT per
  protocol commented `dnat name: "<net>" id: "<container id>"` that jumps to the pod's own
  CNI-DN-<hash> chain, which holds one `-p <proto> --dport <hostPort> -j DNAT` rule per
  mapping. One `iptables-save -t nat` (and `ip6tables-save` when an IPv6 pod has hostPorts) per
  round. The nftables backend keeps them in table `ip`/`ip6` `cni_hostport`, chains `hostports`
  and `hostip_hostports`, each rule `<proto> dport <hostPort> ... dnat to ...` commented with the
  container id: one `nft list table` per family.
- Leases: host-local names a file `<dataDir>/<network>/<address>` per address it handed out,
  whose first line is the container id.
- Masquerade: the bridge and ptp plugins with `ipMasq: true` masquerade each address of the pod.
  iptables (ip6tables for IPv6): in the nat table a POSTROUTING rule `-s <address> -j CNI-<hash>`
  commented `name: "<net>" id: "<container id>"`, the chain holding `-j MASQUERADE`: read from
  the same `iptables-save -t nat` as the DNAT rules. nftables (`ipMasqBackend: nftables`): one
  table `inet cni_plugins_masquerade`, chain `masq_checks`, one rule per address `ip saddr
  <address> ... masquerade` whose comment opens with a hash of network, ifname and container
  id: one `nft -j list table` a round.

What cannot be read is said so (HostSide.errors), never taken as "all there": the comparison
makes it an `unreadable` finding.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import ipaddress
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterable, Mapping

from nri_cni.node.hostmodel import NFT_MASQ, HostPort, HostSide, Lease, Masq
from nri_cni.node.model import Expectation

HOST_LOCAL_DATA_DIR = "/var/lib/cni/networks"  # host-local's default dataDir
TOOL_TIMEOUT = 10.0  # iptables-save answers in milliseconds; this only bounds a wedged xtables lock
_COMMENT_ID = re.compile(r'id: \\"([^"\\]+)\\"')
_JUMP = re.compile(r"\s-j (\S+)")
_PROTO = re.compile(r"\s-p (\S+)")
_DPORT = re.compile(r"\s--dport (\d+)")
_SOURCE = re.compile(r"\s-s (\S+)")
_NFT_RULE = re.compile(r'\b(tcp|udp|sctp) dport (\d+)\b.*\bdnat\b.*\bcomment "([^"]+)"')
_ABSENT = ("No such file or directory", "does not exist")
MASQ_TABLE, MASQ_CHAIN = "cni_plugins_masquerade", "masq_checks"  # the plugins' nftables masquerade
_MASQ_PLUGINS = ("bridge", "ptp")  # the plugins with ipMasq (with an IPAM: layer 3)


# -- what an attachment needs, from its conflist and capability args -----------------------------


@functools.lru_cache(maxsize=256)
def _chain_needs(config: bytes) -> tuple[str, str | None, str | None, tuple[str, ...]]:
    """(the conflist's name, portmap's backend or None without portmap, the masquerade's
    backend or None without ipMasq, host-local dataDirs)."""
    conf = json.loads(config)
    portmap = masq = None
    dirs = []
    for plugin in conf.get("plugins") or []:
        if not isinstance(plugin, Mapping):
            continue
        ipam = plugin.get("ipam")
        if plugin.get("type") == "portmap":
            portmap = str(plugin.get("backend") or default_portmap_backend())
        elif (
            plugin.get("type") in _MASQ_PLUGINS and plugin.get("ipMasq") is True and isinstance(ipam, Mapping)
        ):
            if ipam.get("type"):
                masq = str(plugin.get("ipMasqBackend") or default_portmap_backend())
        if isinstance(ipam, Mapping) and ipam.get("type") == "host-local":
            dirs.append(str(ipam.get("dataDir") or HOST_LOCAL_DATA_DIR))
    return str(conf.get("name") or ""), portmap, masq, tuple(dirs)


def default_portmap_backend() -> str:
    """portmap's own choice when the config names none, and the plugins' ipMasq's: iptables
    where it is usable."""
    return "iptables" if shutil.which("iptables-save") else "nftables"


def nft_masq_owner(network: str, ifname: str, container_id: str) -> str:
    """What opens the comment of the plugins' nftables masquerade rules of one attachment: a
    hash of the network, and one of ifname and container id (16 hex digits of SHA-512 each)."""

    def h(text: str) -> str:
        return hashlib.sha512(text.encode()).hexdigest()[:16]

    return f"{h(network)}-{h(f'{ifname}:{container_id}')}"


def with_host_side(
    exp: Expectation, config: bytes, capability_args: Mapping, container_id: str
) -> Expectation:
    """`exp` with what the chain made on the host for it (host_side_wants) and its container id.
    Raises ValueError for a config or a mapping that cannot be read."""
    ports, masq, leases = host_side_wants(
        config, capability_args, map(str, exp.addresses), container_id=container_id, ifname=exp.ifname
    )
    return dataclasses.replace(exp, container_id=container_id, host_ports=ports, masq=masq, leases=leases)


def host_side_wants(
    config: bytes,
    capability_args: Mapping,
    addresses: Iterable[str],
    *,
    container_id: str = "",
    ifname: str = "",
) -> tuple[tuple[HostPort, ...], tuple[Masq, ...], tuple[Lease, ...]]:
    """The hostPorts portmap must DNAT, the addresses the plugin masquerades and the leases
    host-local must hold for one attachment: its conflist bytes (as cached), its capability
    args, its addresses (plain or with prefix), its container id and ifname (what the rules
    name). Raises ValueError for a config or a mapping that cannot be read."""
    try:
        name, backend, masq_backend, dirs = _chain_needs(config)
    except (json.JSONDecodeError, UnicodeDecodeError, TypeError, AttributeError) as exc:
        raise ValueError(f"the cached config cannot be read: {exc}") from exc
    ips = [ipaddress.ip_address(a.split("/", 1)[0]) for a in addresses]
    families = sorted({ip.version for ip in ips})
    ports = []
    if backend is not None:
        for raw in capability_args.get("portMappings") or []:
            # Go's JSON decoding (portmap's) matches keys whatever their case: containerd's
            # go-cni sends "HostPort", "ContainerPort", "Protocol", "HostIP"
            mapping = {str(k).lower(): v for k, v in raw.items()}
            port = int(mapping["hostport"])
            proto = str(mapping.get("protocol") or "tcp").lower()
            host_ip = mapping.get("hostip") or ""
            only = {ipaddress.ip_address(host_ip).version} if host_ip else set(families)
            ports += [HostPort(f, proto, port, backend) for f in families if f in only]
    leases = tuple(Lease(os.path.join(d, name, str(ip)), str(ip)) for d in dirs for ip in ips) if name else ()
    masq: tuple[Masq, ...] = ()
    if masq_backend is not None:
        owner = container_id if masq_backend == "iptables" else nft_masq_owner(name, ifname, container_id)
        masq = tuple(Masq(ip.version, str(ip), masq_backend, owner) for ip in ips)
    return tuple(dict.fromkeys(ports)), masq, leases


# -- reading the host, once a round -------------------------------------------------------------


def read_host_side(tables: Iterable[str], lease_paths: Iterable[str]) -> HostSide:
    """`tables`: "iptables4", "nftables6"... (HostPort.table, Masq.table); `lease_paths`: files
    to read. One `iptables-save -t nat` per family gives both the DNAT and the masquerade rules."""
    host = HostSide()
    for table in dict.fromkeys(tables):
        try:
            if table.startswith("iptables"):
                text = _run(["iptables-save" if table == "iptables4" else "ip6tables-save", "-t", "nat"])
                host.dnat[table], host.masq[table] = parse_iptables_dnat(text), parse_iptables_masq(text)
            elif table == NFT_MASQ:
                host.masq[table] = parse_nft_masq(_nft(["-j", "list", "table", "inet", MASQ_TABLE]) or "{}")
            else:
                host.dnat[table] = _read_dnat(table)
        except (OSError, subprocess.SubprocessError, RuntimeError, ValueError) as exc:
            host.errors[table] = str(exc) or type(exc).__name__
    for path in dict.fromkeys(lease_paths):
        try:
            with open(path, "rb") as f:
                host.leases[path] = f.read(256).split(b"\n", 1)[0].strip().decode(errors="replace")
        except FileNotFoundError:
            continue
        except OSError as exc:
            host.errors[path] = exc.strerror or str(exc)
    return host


def _read_dnat(table: str) -> dict[str, set[tuple[str, int]]]:
    backend, family = table[:-1], table[-1:]
    if backend == "nftables" and family in ("4", "6"):
        return parse_nft_dnat(_nft(["list", "table", "ip" if family == "4" else "ip6", "cni_hostport"]))
    raise ValueError(f"unknown portmap backend {backend!r}")


def _nft(args: list[str]) -> str:
    """nft's answer; "" when the table is not there (no rule at all)."""
    try:
        return _run(["nft", *args])
    except RuntimeError as exc:
        if any(word in str(exc) for word in _ABSENT):
            return ""
        raise ValueError(str(exc)) from None


def _run(argv: list[str]) -> str:
    exe = shutil.which(argv[0])
    if exe is None:
        raise FileNotFoundError(f"{argv[0]} not found in PATH")
    proc = subprocess.run([exe, *argv[1:]], capture_output=True, timeout=TOOL_TIMEOUT, check=False)
    if proc.returncode != 0:
        raise RuntimeError(
            f"{' '.join(argv)}: exit {proc.returncode}: {proc.stderr.decode(errors='replace').strip()}"
        )
    return proc.stdout.decode(errors="replace")


def parse_iptables_dnat(text: str) -> dict[str, set[tuple[str, int]]]:
    """container id -> {(proto, hostPort)} its CNI-DN chain DNATs, from `iptables-save -t nat`."""
    jumps: dict[str, set[str]] = {}  # container id -> its chains
    dnat: dict[str, set[tuple[str, int]]] = {}  # chain -> (proto, port)
    for line in text.splitlines():
        if not line.startswith("-A "):
            continue
        chain = line.split(None, 2)[1]
        if chain == "CNI-HOSTPORT-DNAT":
            cid, jump = _COMMENT_ID.search(line), _JUMP.search(line)
            if cid and jump:
                jumps.setdefault(cid.group(1), set()).add(jump.group(1))
        elif " -j DNAT" in line:
            proto, port = _PROTO.search(line), _DPORT.search(line)
            if proto and port:
                dnat.setdefault(chain, set()).add((proto.group(1).lower(), int(port.group(1))))
    return {cid: set().union(*(dnat.get(c, set()) for c in chains)) for cid, chains in jumps.items()}


def parse_nft_dnat(text: str) -> dict[str, set[tuple[str, int]]]:
    """container id -> {(proto, hostPort)}, from `nft list table <family> cni_hostport`."""
    out: dict[str, set[tuple[str, int]]] = {}
    for line in text.splitlines():
        m = _NFT_RULE.search(line)
        if m:
            out.setdefault(m.group(3), set()).add((m.group(1), int(m.group(2))))
    return out


def _address(text: str) -> str:
    """ "10.1.0.2/32" or "fd00::2" -> the address as ipaddress writes it."""
    return str(ipaddress.ip_interface(text).ip)


def parse_iptables_masq(text: str) -> dict[str, set[str]]:
    """container id -> {address} masqueraded, from `iptables-save -t nat`: a POSTROUTING rule
    `-s <address>` commented with the id that jumps to a chain holding `-j MASQUERADE`."""
    jumps: list[tuple[str, str, str]] = []  # (container id, address, chain)
    masquerading: set[str] = set()
    for line in text.splitlines():
        if not line.startswith("-A "):
            continue
        chain = line.split(None, 2)[1]
        if chain == "POSTROUTING":
            cid, source, jump = _COMMENT_ID.search(line), _SOURCE.search(line), _JUMP.search(line)
            if cid and source and jump:
                try:
                    jumps.append((cid.group(1), _address(source.group(1)), jump.group(1)))
                except ValueError:
                    continue  # a source that is no address: no rule of the plugins
        elif line.endswith(" -j MASQUERADE") or " -j MASQUERADE " in line:
            masquerading.add(chain)
    out: dict[str, set[str]] = {}
    for owner, address, target in jumps:
        if target in masquerading:
            out.setdefault(owner, set()).add(address)
    return out


def parse_nft_masq(text: str) -> dict[str, set[str]]:
    """owner (the hash opening the comment) -> {address}, from `nft -j list table inet
    cni_plugins_masquerade`: each rule of chain masq_checks that masquerades, by its `saddr ==`."""
    out: dict[str, set[str]] = {}
    for item in json.loads(text).get("nftables") or []:
        rule = item.get("rule") if isinstance(item, Mapping) else None
        if not isinstance(rule, Mapping) or rule.get("chain") != MASQ_CHAIN or not rule.get("comment"):
            continue
        exprs = [e for e in rule.get("expr") or [] if isinstance(e, Mapping)]
        if not any("masquerade" in e for e in exprs):
            continue
        for address in filter(None, map(_saddr, exprs)):
            out.setdefault(str(rule["comment"]).split(",", 1)[0], set()).add(address)
    return out


def _saddr(expr: Mapping) -> str | None:
    """The address of an nft JSON `ip saddr == <address>` match; None for any other expression
    (or a set, a name: no rule of the plugins)."""
    match = expr.get("match")
    if not isinstance(match, Mapping) or match.get("op") != "==" or not isinstance(match.get("right"), str):
        return None
    left = match.get("left")
    payload = left.get("payload") if isinstance(left, Mapping) else None
    if not isinstance(payload, Mapping) or payload.get("field") != "saddr":
        return None
    try:
        return _address(match["right"])
    except ValueError:
        return None
