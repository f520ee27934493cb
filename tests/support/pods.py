"""The pod layer as the composition root (nri_cni/daemon/app.py build_daemon) wires it, for
tests and benches that drive a PodPlan or a PodService without a daemon: every part given,
fresh, under the config's state_dir; no metrics, no readiness gate, no INIT leases. The pod
plans' netns pool (the answer's MAC and MTU) is one for the whole test process, made at its first
use and never closed (its threads wait on their queue), and forgotten in a forked child: the
child has none of the parent's threads, and a job queued to their pool would wait forever
(the mutation tool's runners fork from a process that has run the tests). A service's verifier
makes its own (inspector, pod_inspector) unless given, and closes them."""

from __future__ import annotations

import os

from nri_cni.cni.runtime import CNIRuntime
from nri_cni.config import Config
from nri_cni.node import NodeInspector
from nri_cni.pod.finalized import FinalizedMarks
from nri_cni.pod.intents import IntentStore
from nri_cni.pod.locks import PodLocks
from nri_cni.pod.oprecord import NoSink, OperationSink
from nri_cni.pod.plan import PodPlan
from nri_cni.service.modes import Mode
from nri_cni.service.podstate import HealthBook
from nri_cni.service.roster import Roster
from nri_cni.service.service import PodService

_PLANS_INSPECTOR: list[NodeInspector] = []
os.register_at_fork(after_in_child=_PLANS_INSPECTOR.clear)


def pod_plan(cfg: Config, cni: CNIRuntime, *, sink: OperationSink | None = None) -> PodPlan:
    if not _PLANS_INSPECTOR:
        _PLANS_INSPECTOR.append(NodeInspector.with_workers())
    return PodPlan(
        cfg,
        cni,
        intents=IntentStore(cfg.state_dir),
        finalized=FinalizedMarks(cfg.state_dir),
        sink=NoSink() if sink is None else sink,
        inspector=_PLANS_INSPECTOR[0],
    )


def pod_service(
    cfg: Config,
    plan: PodPlan,
    *,
    mode: Mode | None = None,
    inspector: NodeInspector | None = None,
    pod_inspector: NodeInspector | None = None,
) -> PodService:
    return PodService(
        cfg,
        plan=plan,
        mode=mode,
        roster=Roster(),
        locks=PodLocks(),
        health=HealthBook(),
        inspector=inspector,
        pod_inspector=pod_inspector,
    )
