"""The pod service's parts, made once (service.py) and given to each of its jobs: the verbs
(verbs.py), the timers (timers.py) and the view (snapshot.py)."""

from __future__ import annotations

from dataclasses import dataclass

from nri_cni.config import Config, ConfigSource
from nri_cni.pod.locks import PodLocks
from nri_cni.pod.plan import PodPlan
from nri_cni.service.modes import Mode, mode_in_force
from nri_cni.service.podstate import HealthBook
from nri_cni.service.roster import Roster
from nri_cni.service.verify import Verifier


@dataclass(frozen=True)
class ServiceParts:
    source: ConfigSource  # the config in force
    plan: PodPlan
    roster: Roster
    locks: PodLocks
    health: HealthBook  # each pod's verdict from the last verify (podstate.py)
    verifier: Verifier

    @property
    def cfg(self) -> Config:
        return self.source.current

    @property
    def mode(self) -> Mode:
        return mode_in_force(self.source)
