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

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from nri_cni.cni.cache import CacheEntry, ResultCache
from nri_cni.config import Config, ConfigSource
from nri_cni.pod.model import PodInfo, PrimaryNetwork, RuntimePrimary


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
    def runtime_reports_our_ips(self) -> bool:
        """The IPs the runtime reports for a pod (PodSandbox.ips) came from nri-cni's answer:
        the shim's ADD (eth0's), or the RunPodSandbox answer (native)."""
        ...

    @property
    def adds_behind_runtime(self) -> bool:
        """Verify may ADD a network a listed pod lacks. Not in native mode: the runtime learns a
        pod's IPs only from the RunPodSandbox answer, so such a pod is reported "missed"."""
        ...

    @property
    def primary(self) -> PrimaryNetwork:
        """The primary network's name and whether it is nri-cni's (eth0)."""
        ...

    def nothing_to_make_true(self, pod: PodInfo, entries: Sequence[CacheEntry]) -> bool:
        """A pod with no attachment of nri-cni's and no IP the runtime reports has no network the
        runtime knows of for a repair to make true (shim: a pod in creation, or one the runtime
        never networked)."""
        ...

    def lack_is_missed(self, missing: bool, mismatch: str) -> bool:
        """A pod that lacks a network (or whose IPs the runtime did not take) is "missed", not
        repaired, unless the IPs the runtime lists give that network back (native: the runtime
        learns IPs only from the RunPodSandbox answer)."""
        ...

    def primary_ips(self, pod: PodInfo) -> tuple[str, ...]:
        """The addresses a repair asks for the primary network: the runtime's IPs of the pod
        when they are eth0's (shim), else () (each network asks for its own)."""
        ...

    def runtime_primary(self, pod: PodInfo) -> RuntimePrimary | None:
        """The runtime's own primary network of the pod (FINALIZE runs for it too), or None
        when the primary is nri-cni's."""
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
    runtime_reports_our_ips: bool = True
    adds_behind_runtime: bool = True

    def nothing_to_make_true(self, pod: PodInfo, entries: Sequence[CacheEntry]) -> bool:
        return not entries and not pod.ips

    def lack_is_missed(self, missing: bool, mismatch: str) -> bool:
        return False

    def primary_ips(self, pod: PodInfo) -> tuple[str, ...]:
        return pod.ips

    def runtime_primary(self, pod: PodInfo) -> RuntimePrimary | None:
        return None

    def runtime_attachments(self) -> list[CacheEntry]:
        return []


@dataclass(frozen=True)
class NativeMode:
    """The runtime runs no CNI: RunPodSandbox attaches and answers with the networks."""

    primary: PrimaryNetwork
    name: str = "native"
    attaches_on_run: bool = True
    answers_run_pod: bool = True
    runtime_reports_our_ips: bool = True
    adds_behind_runtime: bool = False

    def nothing_to_make_true(self, pod: PodInfo, entries: Sequence[CacheEntry]) -> bool:
        return False

    def lack_is_missed(self, missing: bool, mismatch: str) -> bool:
        return missing or bool(mismatch)

    def primary_ips(self, pod: PodInfo) -> tuple[str, ...]:
        return ()

    def runtime_primary(self, pod: PodInfo) -> RuntimePrimary | None:
        return None

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
    runtime_reports_our_ips: bool = False
    adds_behind_runtime: bool = True

    def nothing_to_make_true(self, pod: PodInfo, entries: Sequence[CacheEntry]) -> bool:
        return False

    def lack_is_missed(self, missing: bool, mismatch: str) -> bool:
        return False

    def primary_ips(self, pod: PodInfo) -> tuple[str, ...]:
        return ()

    def runtime_primary(self, pod: PodInfo) -> RuntimePrimary | None:
        entry = self.runtime_cache.read(self.primary.name, pod.id, "eth0")
        return RuntimePrimary(self.primary.name, entry)

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
