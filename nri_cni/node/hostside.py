"""What a pod needs on the host besides links, read once a round for every pod: portmap's DNAT
rules for its hostPorts and host-local's leases of its addresses (issue 21, item 3).

- DNAT: portmap's iptables backend makes, in the nat table, a rule in CNI-HOSTPORT-DNAT per
  protocol commented `dnat name: "<net>" id: "<container id>"` that jumps to the pod's own
  CNI-DN-<hash> chain, which holds one `-p <proto> --dport <hostPort> -j DNAT` rule per
  mapping. One `iptables-save -t nat` (and `ip6tables-save` when an IPv6 pod has hostPorts) per
  round. The nftables backend keeps them in table `ip`/`ip6` `cni_hostport`, chains `hostports`
  and `hostip_hostports`, each rule `<proto> dport <hostPort> ... dnat to ...` commented with the
  container id: one `nft list table` per family.
- Leases: host-local names a file `<dataDir>/<network>/<address>` per address it handed out,
  whose first line is the container id.

What cannot be read is said so (HostSide.errors), never taken as "all there": the comparison
makes it an `unreadable` finding.
"""

from __future__ import annotations

import functools
import ipaddress
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterable, Mapping

from nri_cni.node.model import HostPort, HostSide, Lease

HOST_LOCAL_DATA_DIR = "/var/lib/cni/networks"  # host-local's default dataDir
TOOL_TIMEOUT = 10.0  # iptables-save answers in milliseconds; this only bounds a wedged xtables lock
_COMMENT_ID = re.compile(r'id: \\"([^"\\]+)\\"')
_JUMP = re.compile(r"\s-j (\S+)")
_PROTO = re.compile(r"\s-p (\S+)")
_DPORT = re.compile(r"\s--dport (\d+)")
_NFT_RULE = re.compile(r'\b(tcp|udp|sctp) dport (\d+)\b.*\bdnat\b.*\bcomment "([^"]+)"')
_ABSENT = ("No such file or directory", "does not exist")


# -- what an attachment needs, from its conflist and capability args -----------------------------


@functools.lru_cache(maxsize=256)
def _chain_needs(config: bytes) -> tuple[str, str | None, tuple[str, ...]]:
    """(the conflist's name, portmap's backend or None without portmap, host-local dataDirs)."""
    conf = json.loads(config)
    portmap = None
    dirs = []
    for plugin in conf.get("plugins") or []:
        if not isinstance(plugin, Mapping):
            continue
        if plugin.get("type") == "portmap":
            portmap = str(plugin.get("backend") or default_portmap_backend())
        ipam = plugin.get("ipam")
        if isinstance(ipam, Mapping) and ipam.get("type") == "host-local":
            dirs.append(str(ipam.get("dataDir") or HOST_LOCAL_DATA_DIR))
    return str(conf.get("name") or ""), portmap, tuple(dirs)


def default_portmap_backend() -> str:
    """portmap's own choice when the config names none: iptables where it is usable."""
    return "iptables" if shutil.which("iptables-save") else "nftables"


def host_side_wants(
    config: bytes, capability_args: Mapping, addresses: Iterable[str]
) -> tuple[tuple[HostPort, ...], tuple[Lease, ...]]:
    """The hostPorts portmap must DNAT and the leases host-local must hold for one attachment:
    its conflist bytes (as cached), its capability args, its addresses (plain or with prefix).
    Raises ValueError for a config or a mapping that cannot be read."""
    try:
        name, backend, dirs = _chain_needs(config)
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
    return tuple(dict.fromkeys(ports)), leases


# -- reading the host, once a round -------------------------------------------------------------


def read_host_side(tables: Iterable[str], lease_paths: Iterable[str]) -> HostSide:
    """`tables`: "iptables4", "nftables6"... (HostPort.table); `lease_paths`: files to read."""
    host = HostSide()
    for table in dict.fromkeys(tables):
        try:
            host.dnat[table] = _read_dnat(table)
        except (OSError, subprocess.SubprocessError, ValueError) as exc:
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
    backend, family = table[:-1], int(table[-1])
    if backend == "iptables":
        tool = "iptables-save" if family == 4 else "ip6tables-save"
        return parse_iptables_dnat(_run([tool, "-t", "nat"]))
    if backend == "nftables":
        try:
            text = _run(["nft", "list", "table", "ip" if family == 4 else "ip6", "cni_hostport"])
        except RuntimeError as exc:
            if any(word in str(exc) for word in _ABSENT):
                return {}  # no table: no rule at all
            raise ValueError(str(exc)) from None
        return parse_nft_dnat(text)
    raise ValueError(f"unknown portmap backend {backend!r}")


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
