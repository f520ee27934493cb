"""The three modes as objects: one small policy class each, chosen once at start (mode_for).

| question                                  | shim       | secondary                  | native     |
|-------------------------------------------|------------|----------------------------|------------|
| NRI RunPodSandbox runs the ADD            | no (the shim's CNI ADD does) | yes      | yes        |
| the NRI answer carries the networks       | no         | no                         | yes        |
| eth0 (the primary network) is nri-cni's   | yes        | no: the runtime's network  | yes        |
| where the primary's result comes from     | our ADD    | the runtime's libcni cache | our ADD    |
| the runtime's pod IPs are nri-cni's       | yes (eth0's) | no: its own network's      | yes (all)  |
| verify adds a network a pod lacks         | yes (asking the runtime's IP) | yes  | no: "missed" |

StopPodSandbox detaches in every mode. This module (and config parsing) are the only places
that read the mode's name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from nri_cni.cni.cache import CacheEntry, ResultCache
from nri_cni.config import Config, ConfigSource
from nri_cni.pod.model import Key, PrimaryNetwork, RuntimePrimary
from nri_cni.pod.repair import plain, result_ips
from nri_cni.service.podcheck import PodCheck
from nri_cni.service.roster import PodRecord


@dataclass(frozen=True)
class RuntimeIps:
    """What a mode makes of the IPs the runtime reports of a pod against nri-cni's records, for
    one verify round (`Mode.runtime_ips`)."""

    primary: Key | None  # nri-cni's primary attachment (eth0), when the primary is nri-cni's
    mismatch: str = ""  # what differs between the runtime's IPs and the primary's
    lost: str = ""  # the runtime's own network of the pod is gone (secondary)
    nothing_to_make_true: bool = False  # no network the runtime knows of for a repair to make true
    missed: bool = False  # a lack is reported "missed", not repaired, unless `readd` gives it back
    readd: Mapping[Key, tuple[str, ...]] = field(default_factory=dict)  # the network with those IPs
    primary_ips: tuple[str, ...] = ()  # what a repair asks the primary for (the runtime's IPs)


def our_primary(primary: PrimaryNetwork, c: PodCheck) -> tuple[Key | None, set[str] | None]:
    """nri-cni's primary attachment of the pod (eth0), when the primary is nri-cni's, and the
    addresses its result holds (None: no such attachment with a result)."""
    if not primary.ours or not c.selected:
        return None, None
    key = c.selected[0].key
    entry = next((e for e in c.entries if e.key == key), None)
    if entry is None or entry.result is None:
        return key, None
    return key, {plain(a) for a in result_ips(entry)}


def native_readd(c: PodCheck, mismatch: str) -> dict[Key, tuple[str, ...]]:
    """Native mode: the one network a pod lacks, with the IPs the runtime lists and no other
    attachment holds ({} if none). A native runtime runs no CNI: an IP it lists came from
    nri-cni's answer, so the pod lost that network since (an ADD or repair cut by a crash and
    rolled back); asking for those IPs makes what the runtime reports true again. With two
    missing, whose IP is whose cannot be told: "missed"."""
    if mismatch or len(c.missing) != 1 or not c.pod.ips:
        return {}
    held = {plain(a) for e in c.entries for a in result_ips(e)}
    left = tuple(ip for ip in c.pod.ips if plain(ip) not in held)
    return {c.missing[0].key: left} if left else {}


class Mode(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def attaches_on_run(self) -> bool:
        """NRI RunPodSandbox runs the ADD."""
        ...

    @property
    def answers_run_pod(self) -> bool:
        """The RunPodSandbox answer carries the pod's networks."""
        ...

    @property
    def primary(self) -> PrimaryNetwork:
        """The primary network's name and whether it is nri-cni's (eth0)."""
        ...

    def runtime_ips(self, c: PodCheck, record: PodRecord) -> RuntimeIps:
        """What verify makes of the IPs the runtime reports of the pod against what nri-cni
        holds of it (`c`: the round's reading, `record`: the roster's)."""
        ...

    @property
    def runtime_primary(self) -> RuntimePrimary | None:
        """The runtime's own primary network and its libcni cache (FINALIZE runs for it too),
        or None when the primary is nri-cni's."""
        ...

    def runtime_attachments(self) -> list[CacheEntry]:
        """The runtime's own primary attachments (eth0), from its libcni cache: what
        `nri-cni pods` shows besides nri-cni's own; [] when the primary is nri-cni's."""
        ...


@dataclass(frozen=True)
class ShimMode:
    """The runtime calls nri-cni through its CNI path (nri-cni-shim); NRI only tells of pods."""

    primary: PrimaryNetwork
    name: str = "shim"
    attaches_on_run: bool = False
    answers_run_pod: bool = False
    runtime_primary: RuntimePrimary | None = field(default=None, init=False)

    def runtime_ips(self, c: PodCheck, record: PodRecord) -> RuntimeIps:
        """The runtime's IPs must be eth0's; a repair asks eth0 for them; a pod with nothing of
        nri-cni's and no IP the runtime reports has no network for a repair to make true (a pod
        in creation, or one the runtime never networked)."""
        primary, ours = our_primary(self.primary, c)
        theirs = set(c.pod.ips)
        mismatch = ""
        if ours is not None and theirs and not theirs <= ours:
            assert primary is not None
            mismatch = (
                f"the runtime reports {', '.join(c.pod.ips)}; {primary[1]} has {', '.join(sorted(ours))}"
            )
        nothing = not c.entries and not c.pod.ips
        return RuntimeIps(primary, mismatch, nothing_to_make_true=nothing, primary_ips=c.pod.ips)

    def runtime_attachments(self) -> list[CacheEntry]:
        return []


@dataclass(frozen=True)
class NativeMode:
    """The runtime runs no CNI: RunPodSandbox attaches and answers with the networks."""

    primary: PrimaryNetwork
    name: str = "native"
    attaches_on_run: bool = True
    answers_run_pod: bool = True
    runtime_primary: RuntimePrimary | None = field(default=None, init=False)

    def runtime_ips(self, c: PodCheck, record: PodRecord) -> RuntimeIps:
        """Every IP nri-cni answered must be among the runtime's; the runtime learns IPs only
        from the RunPodSandbox answer, so a pod that lacks a network (or whose IPs the runtime
        did not take) is "missed", unless the IPs it lists give that one network back."""
        primary, ours = our_primary(self.primary, c)
        mismatch = ""
        if ours is not None and not ours <= set(c.pod.ips):
            shown = ", ".join(c.pod.ips) or "no IP"
            mismatch = f"the runtime reports {shown}; nri-cni gave it {', '.join(sorted(ours))}"
        missed = bool(c.missing) or bool(mismatch)
        readd = native_readd(c, mismatch) if missed else {}
        return RuntimeIps(primary, mismatch, missed=missed, readd=readd)

    def runtime_attachments(self) -> list[CacheEntry]:
        return []


@dataclass(frozen=True)
class SecondaryMode:
    """The runtime attaches its own network (eth0); nri-cni adds the others on RunPodSandbox."""

    primary: PrimaryNetwork
    runtime_cache: ResultCache = field(compare=False)
    name: str = "secondary"
    attaches_on_run: bool = True
    answers_run_pod: bool = False
    runtime_primary: RuntimePrimary = field(init=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "runtime_primary", RuntimePrimary(self.primary.name, self.runtime_cache))

    def runtime_ips(self, c: PodCheck, record: PodRecord) -> RuntimeIps:
        """The runtime's IPs are its own network's, never compared with nri-cni's. A pod with
        nri-cni's networks that the runtime listed with IPs and now lists without has lost the
        runtime's own network, or the runtime its record of it: CRI-O restarted in the middle
        of the pod's stop (after its CNI DEL) lists such a pod READY without an IP."""
        primary, _ = our_primary(self.primary, c)
        if not c.entries or c.pod.ips or not record.ips_lost:
            return RuntimeIps(primary)
        lost = (
            "the runtime reports no IP for it: its own network of the pod is gone or unknown to it "
            "(a runtime restarted in the middle of the pod's stop or creation lists it READY without an "
            "IP); nri-cni keeps its networks while the runtime lists the pod"
        )
        return RuntimeIps(primary, lost=lost)

    def runtime_attachments(self) -> list[CacheEntry]:
        if not self.primary.name:
            return []
        return [e for e in self.runtime_cache.entries(network=self.primary.name) if e.ifname == "eth0"]


def mode_in_force(source: ConfigSource) -> Mode:
    """The mode of the config in force (made once per config; a reload may change its
    primary_network): the one object every part of the pod service asks."""
    return source.derived("mode", mode_for)


def mode_for(cfg: Config) -> Mode:
    """The mode of a (validated) config; the one place that reads `cfg.mode`."""
    if cfg.mode == "secondary":
        return SecondaryMode(
            PrimaryNetwork(cfg.primary_network, ours=False), ResultCache(cfg.cni.runtime_cache_dir)
        )
    if cfg.mode == "native":
        return NativeMode(PrimaryNetwork(cfg.primary_network, ours=True))
    return ShimMode(PrimaryNetwork(cfg.primary_network, ours=True))
