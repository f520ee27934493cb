"""repair: make one pod's damaged attachments true again, with the same IPs.

A verb of the pod plan (PodPlan.repair). The caller (the pod service's verify,
nri_cni/service/verify.py) holds the pod's lock and has decided
what is wrong. A repair DELs each damaged attachment from its cache entry (the config it was made
with: a reload since does not change it), then ADDs what the pod lacks asking the IPAM for every
address it had, both families (RuntimeConf.ip_request: the `ips` capability where a plugin of the
chain declares it, else `args.cni.ips` for host-local and static; never CNI_ARGS `IP=`, which
takes one address), then FINALIZEs all of the pod's networks: the attach path does the ADDs,
with its intent record and its rollback. The request belongs to that ADD alone: the cache entry
and the intent record keep none, so the pod's later DEL, CHECK and rollback never carry it.

Before anything is touched: an address another pod's attachment holds is never asked for
(`IpTaken`), and a chain that cannot be asked for addresses at all is not cut (`IpsNotRequestable`:
a DEL and a new ADD would hand the pod other IPs than the runtime reports). An IPAM that refuses
an address fails the ADD with an error naming it as unavailable (`IpTaken` too).

One operation record `"op":"repair"` per repair: what was wrong (`wrong`), what was done (the
steps, and `asked` for the addresses).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from nri_cni.cni.cache import CacheEntry
from nri_cni.cni.config import parse_conflist
from nri_cni.cni.plugin_io import ip_request_method
from nri_cni.cni.prev_result import conf_of
from nri_cni.cni.runtime import CNIRuntime
from nri_cni.errors import CniCode, CNIError, NriCniError, PodError
from nri_cni.pod.attach import Attacher
from nri_cni.pod.detach import attach_order
from nri_cni.pod.model import AttachRequest, Key, PodInfo, PodNetworks, RuntimePrimary
from nri_cni.pod.oprecord import OperationLog, OpRecord
from nri_cni.pod.rollback import Rollback
from nri_cni.pod.select import Selected
from nri_cni.safety.validate import ifname_problem


class IpTaken(PodError):
    """The address a repair must ask for belongs to another pod (or the IPAM refused it); the
    message names the address (and the pod holding it, when known)."""


class IpsNotRequestable(PodError):
    """A network that must get given addresses back has no way to be asked for them; the
    message names the network."""


def plain(address: str) -> str:
    return address.split("/", 1)[0]


def result_ips(entry: CacheEntry) -> tuple[str, ...]:
    """The addresses (with prefix) an attachment's cached result holds, in its order."""
    result = entry.result or {}
    out = [ip["address"] for ip in result.get("ips") or [] if isinstance(ip, dict) and ip.get("address")]
    for old in ("ip4", "ip6"):  # results of 0.1.0/0.2.0
        value = result.get(old)
        if isinstance(value, dict) and value.get("ip"):
            out.append(value["ip"])
    return tuple(out)


def ip_holders(entries: Iterable[CacheEntry]) -> dict[str, str]:
    """address (plain) -> the pod whose attachment holds it, from the cache."""
    return {plain(ip): e.container_id for e in entries for ip in result_ips(e)}


def repair_selection(
    selected: Sequence[Selected], entries: Sequence[CacheEntry], damaged: Iterable[Key]
) -> list[Selected]:
    """The networks a repair ADDs or keeps, in the pod's order: each that has an attachment with
    the config and capability arguments it was made with (the port mappings the runtime gave
    its ADD are in no config), then damaged ones the config no longer names (from the cache)."""
    by_key = {e.key: e for e in entries}
    out = []
    for sel in selected:
        entry = by_key.pop(sel.key, None)
        out.append(sel if entry is None else _from_cache(sel, entry))
    for key in damaged:
        entry = by_key.get(key)
        if entry is not None:
            out.append(_from_cache(None, entry))
    return out


def _from_cache(sel: Selected | None, entry: CacheEntry) -> Selected:
    net = parse_conflist(entry.config, source=f"cache:{entry.path}")
    if sel is not None:
        spec = dataclasses.replace(sel.network, conflist=net)
    else:
        from nri_cni.config import NetworkSpec  # lazy: only a network gone from the config

        spec = NetworkSpec(name=entry.network_name, conflist=net)
    return Selected(spec, entry.ifname, dict(entry.capability_args))


class Repairer:
    """The pod plan's repair verb, built with the collaborators it drives: the CNI runtime (its
    cache says who holds an address; CHECK), the rollback (DEL of a damaged attachment), the
    attacher (ADD with the addresses asked for, FINALIZE) and the operation log."""

    def __init__(
        self, cni: CNIRuntime, *, rollback: Rollback, attacher: Attacher, oplog: OperationLog
    ) -> None:
        self.cni = cni
        self.rollback = rollback
        self.attacher = attacher
        self.oplog = oplog

    async def repair(
        self,
        pod: PodInfo,
        *,
        selected: Sequence[Selected],
        damaged: Sequence[CacheEntry],
        ips: Mapping[Key, tuple[str, ...]],
        wrong: Sequence[str],
        runtime_primary: RuntimePrimary | None = None,
    ) -> PodNetworks:
        """DEL `damaged`, ADD what `selected` lacks asking for `ips`, FINALIZE all. The caller
        holds the pod's lock. Raises IpTaken (nothing touched, or the IPAM refused),
        IpsNotRequestable (nothing touched) or NriCniError."""
        record = OpRecord("repair", pod)
        record.extra = {"wrong": list(wrong), "asked": {f"{n}/{i}": list(a) for (n, i), a in ips.items()}}
        try:
            others = (e for e in self.cni.cache.entries() if e.container_id != pod.id)
            _check_not_held(pod, ip_holders(others), ips)
            _check_requestable(pod, selected, ips)
            for entry in reversed(attach_order(list(damaged))):
                t0 = time.perf_counter()
                await self.rollback.delete_entry(entry, netns=pod.netns, observe=record)
                record.step(entry.network_name, entry.ifname, "del", t0)
            request = AttachRequest(ips=dict(ips))
            try:
                return await self.attacher.attach(pod, list(selected), request, record, runtime_primary)
            except NriCniError as exc:
                refused = _refused_address(exc, ips.values())
                if refused:
                    raise IpTaken(
                        f"pod {pod.label()}: the IPAM refused its address {refused}: {exc}"
                    ) from exc
                raise
        except NriCniError as exc:
            record.fail(exc)
            raise
        finally:
            self.oplog.emit(record)

    async def check_entry(self, entry: CacheEntry, netns: str) -> str:
        """CNI CHECK of one attachment with its cached result: "" when it passes (or the chain
        cannot be checked: before 0.4.0, disableCheck), else the plugin's error."""
        net = parse_conflist(entry.config, source=f"cache:{entry.path}")
        try:
            await self.cni.check(net, conf_of(entry, netns or entry.netns), host_macs_as_now, entry=entry)
        except CNIError as exc:
            if (
                exc.cni_code == CniCode.INCOMPATIBLE_VERSION
                and exc.ref.command == "CHECK"
                and not exc.ref.plugin
            ):
                return ""  # the config's version has no CHECK: nothing to learn
            return str(exc)
        except NriCniError as exc:
            return str(exc)
        return ""


def _check_not_held(pod: PodInfo, holders: Mapping[str, str], ips: Mapping[Key, tuple[str, ...]]) -> None:
    for addresses in ips.values():
        for address in addresses:
            holder = holders.get(plain(address))
            if holder is not None:
                raise IpTaken(
                    f"pod {pod.label()}: its address {plain(address)} now belongs to pod {holder[:12]}"
                )


def _check_requestable(
    pod: PodInfo, selected: Sequence[Selected], ips: Mapping[Key, tuple[str, ...]]
) -> None:
    for sel in selected:
        if ips.get(sel.key) and not ip_request_method(sel.network.conflist):
            raise IpsNotRequestable(
                f"pod {pod.label()}: network {sel.network.name!r} ({sel.ifname}) must get "
                f"{', '.join(map(plain, ips[sel.key]))} back, and no plugin "
                "of its chain can be asked for an address (no `ips` capability, no IPAM that "
                "reads args.cni.ips): not cut, as a new ADD would give it other IPs"
            )


# how IPAMs say an address asked for is not theirs to give (host-local: "requested IP address
# X is not available in range set ...", "... has been allocated to ..."; static and others:
# "already in use", "already reserved")
_REFUSALS = ("not available", "already", "allocated", "in use", "reserved")


def _refused_address(exc: NriCniError, asked: Iterable[tuple[str, ...]]) -> str:
    """The asked-for address an ADD's error says the IPAM would not give. An error that merely
    contains the address (one that could not parse the request, say) is no refusal."""
    text = _full_text(exc)
    lowered = text.lower()
    if not any(word in lowered for word in _REFUSALS):
        return ""
    for addresses in asked:
        for address in addresses:
            ip = plain(address)
            at = text.find(ip)
            # the address itself, not a longer one it begins (10.0.0.1 in 10.0.0.12)
            while (
                at >= 0
                and at + len(ip) < len(text)
                and (text[at + len(ip)].isalnum() or text[at + len(ip)] in ".:")
            ):
                at = text.find(ip, at + 1)
            if at >= 0:
                return ip
    return ""


def _full_text(exc: BaseException) -> str:
    parts: list[str] = []
    seen: BaseException | None = exc
    while seen is not None and len(parts) < 8:
        parts.append(str(seen))
        seen = getattr(seen, "cause", None) or seen.__cause__
    return " ".join(parts)


def host_macs_as_now(prev: dict[str, Any]) -> dict[str, Any]:
    """The result's host-side interfaces (no sandbox) with the MACs they have now. A bridge
    without a fixed MAC takes the lowest of its ports' (it changes as pods come and go:
    plugins#60), and udev may rewrite a host veth's (plugins#805): the bridge plugin's CHECK
    would call every pod made before such a change damaged, and a repair would cut its network
    for nothing. What identifies the host side, its links and the veth's bridge, netlink judges
    (nri_cni/node); the pod's own interface keeps its MAC check."""
    ifaces = prev.get("interfaces")
    if not isinstance(ifaces, list):
        return prev
    fixed = []
    for iface in ifaces:
        name = iface.get("name") if isinstance(iface, dict) else None
        if isinstance(name, str) and not iface.get("sandbox") and not ifname_problem(name):
            try:
                mac = Path("/sys/class/net", name, "address").read_text().strip()
            except OSError:
                mac = ""  # gone: CHECK says so
            if mac:
                iface = {**iface, "mac": mac}
        fixed.append(iface)
    return {**prev, "interfaces": fixed}
