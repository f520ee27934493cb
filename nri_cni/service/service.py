"""The pod service: every pod operation enters here, whatever reached the daemon.

Entry points (NRI handlers, the local socket, the daemon's timers) translate their protocol
into calls of its parts, one per job, and nothing else:

- `verbs` (verbs.py): the per-pod verbs (attach, detach, remove, check, the NRI pod events),
  each under the pod's lock (nri_cni/pod/locks.py), in a task of its own;
- `timers` (timers.py): the node-wide work (the runtime's pod list, GC, verify rounds, the
  netns reaper, start-up recovery);
- `view` (snapshot.py): what the reports read, one snapshot at a time.

They share the pod roster (roster.py), the pod locks and the health book (podstate.py), given
by the composition root, and the verifier (verify.py), which this class makes for them: one
record of them (`ServiceParts`, parts.py) is given to each.
"""

from __future__ import annotations

from nri_cni.config import Config, ConfigSource
from nri_cni.node import NodeInspector
from nri_cni.pod.locks import PodLocks
from nri_cni.pod.plan import PodPlan
from nri_cni.service.modes import Mode, mode_in_force
from nri_cni.service.parts import ServiceParts
from nri_cni.service.podstate import HealthBook
from nri_cni.service.roster import Roster
from nri_cni.service.snapshot import ServiceView
from nri_cni.service.timers import ServiceTimers
from nri_cni.service.verbs import PodVerbs
from nri_cni.service.verify import Verifier


class PodService:
    def __init__(
        self,
        cfg: Config | ConfigSource,
        *,
        plan: PodPlan,
        mode: Mode | None = None,
        roster: Roster,
        locks: PodLocks,
        health: HealthBook,
        inspector: NodeInspector | None = None,
        pod_inspector: NodeInspector | None = None,
    ) -> None:
        """`cfg`: the daemon's ConfigSource (a Config: a source of its own); `mode`: the mode
        made from it (default mode_for); `roster`, `locks`, `health`, `inspector` (the verify
        rounds' netns pool), `pod_inspector` (the pods' own, the pod plan's too): the
        composition root's, which others read too (the metrics: pods by verdict)."""
        self.source = ConfigSource.of(cfg)
        if mode is not None:
            self.source.seed("mode", mode)
        self.plan = plan
        self.roster = roster
        self.locks = locks
        self.health = health  # each pod's verdict from the last verify (podstate.py)
        self.verifier = Verifier(
            self.source,
            plan=plan,
            roster=self.roster,
            locks=self.locks,
            health=self.health,
            inspector=inspector,
            pod_inspector=pod_inspector,
        )
        self.parts = ServiceParts(self.source, plan, self.roster, self.locks, self.health, self.verifier)
        self.verbs = PodVerbs(self.parts)
        self.timers = ServiceTimers(self.parts)
        self.view = ServiceView(self.parts, background=self.timers.background)

    @property
    def cfg(self) -> Config:
        """The config in force: a hot reload (ConfigSource.replace) applies to the next operation."""
        return self.source.current

    @property
    def mode(self) -> Mode:
        """The mode of the config in force (its primary_network may change on a reload): the
        one object the NRI handlers, the verifier and the service's parts share."""
        return mode_in_force(self.source)

    async def close(self) -> None:
        """Stops the background work (GC and repair after a Synchronize, the removal timers, the
        rounds' CHECKs)."""
        self.verbs.close()
        await self.timers.close()
        await self.verifier.checker.close()  # after the rounds: none queues any more
        self.verifier.close()
