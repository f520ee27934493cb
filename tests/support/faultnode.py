"""What the containerd fault tests share (no tests in here): a churn of pod creations and removals
that runs while the test kills containerd, a slow second NRI plugin, and the acceptance check
after nri-cni's reconnect: every pod containerd lists READY has exactly its networks
with the IPs containerd reports, or nri-cni reports it broken by name for a listed reason; pods
reach each other.
"""

from __future__ import annotations

import asyncio
import random
import re
import signal
import threading
import time
import uuid

from tests.support.cutcalls import CutCalls
from tests.support.leaks import LeakChecker
from tests.support.nricni import NriCni
from tests.support.podtruth import RuntimePod, reaches, whole_problems
from tests.support.recovery_node import RecoveryNode, pod_ids_in
from tests.support.stubthread import Recorder

# the node is true again soon after nri-cni's reconnect (about 5 s on a quiet machine:
# the seconds are printed, and measured side by side in bench/); a test waits for that event
# with a generous deadline, never asserting the seconds
SETTLE = 120.0


class Churn:
    """`workers` threads creating pods and removing two of three, each call once: a call that
    meets a dead runtime fails and is counted, never retried (the end state is what the test
    judges, not how many calls got through). Each failed call is put down to its cause
    (tests/support/cutcalls.py): the runtime down or restarting is expected, anything else
    (an error of nri-cni's while the runtime was up) fails the test when the churn stops; the
    counts are printed."""

    def __init__(self, rnode: RecoveryNode, workers: int = 4, keep_at_most: int = 8) -> None:
        self.rnode = rnode
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self.created: list[str] = []
        self.kept: list[str] = []
        self.failed: list[str] = []
        self.cut = CutCalls(lambda: getattr(self.rnode.ctd, "pid", None))
        self.keep_at_most = keep_at_most
        self.threads = [threading.Thread(target=self._work, args=(i,), daemon=True) for i in range(workers)]

    def start(self) -> Churn:
        for t in self.threads:
            t.start()
        return self

    def _work(self, worker: int) -> None:
        rng = random.Random(worker)
        while not self.stopping.is_set():
            name = f"churn-{worker}-{uuid.uuid4().hex[:6]}"
            try:
                pod = self.cut.call(f"run {name}", self.rnode.run_pod, name, ports=rng.random() < 0.5)
            except Exception as exc:
                self._failed(f"run {name}: {exc}")
                continue
            with self.lock:
                self.created.append(pod)
                keep = len(self.kept) < self.keep_at_most and rng.random() < 1 / 3
                if keep:
                    self.kept.append(pod)
            if not keep:
                try:
                    self.cut.call(f"remove {pod[:12]}", self.rnode.remove_pod, pod)
                except Exception as exc:
                    self._failed(f"remove {pod[:12]}: {exc}")

    def _failed(self, what: str) -> None:
        with self.lock:
            self.failed.append(what)
        time.sleep(0.05)  # containerd is down: do not spin

    def wait_created(self, count: int, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while len(self.created) < count:
            assert time.monotonic() < deadline, f"churn made {len(self.created)} pods, not {count}"
            time.sleep(0.02)

    def stop(self) -> None:
        """Ends the churn; then every failed call must be one the runtime's fault cut."""
        self.stopping.set()
        for t in self.threads:
            t.join(120)
            assert not t.is_alive(), "a churn worker hangs"
        self.cut.assert_no_failures()


class SlowNri(Recorder):
    """A second NRI plugin that takes its time in RunPodSandbox (NRI calls are serialized, so it
    holds back every pod behind it); while `hold` is set it holds the call until it is cleared."""

    def __init__(self, delay: float) -> None:
        super().__init__()
        self.delay = delay
        self.hold = threading.Event()
        self.held: list[str] = []

    async def run_pod_sandbox(self, pod) -> None:
        if self.hold.is_set():
            self._add(lambda: self.held.append(pod.id))
            while self.hold.is_set():
                await asyncio.sleep(0.01)
        await asyncio.sleep(self.delay)
        await super().run_pod_sandbox(pod)


def synchronizations(daemon: NriCni) -> int:
    return daemon.log_path.read_text(errors="replace").count("synchronized: the runtime has")


def wait_resynchronized(daemon: NriCni, count: int, timeout: float = 60) -> None:
    """Until nri-cni has synchronized `count` times (each connection to containerd once)."""
    deadline = time.monotonic() + timeout
    while synchronizations(daemon) < count or not daemon.status()["nri"]["synchronized"]:
        assert time.monotonic() < deadline, f"nri-cni did not reconnect:\n{daemon.log_tail()}"
        time.sleep(0.02)


# The faults of a churn test, one round each: kill -9 twice, a clean stop between.
CHURN_FAULTS = ["kill9", "stop", "kill9"]
ROUNDS = len(CHURN_FAULTS)


def churn_through_runtime_faults(rnode: RecoveryNode, churn: Churn, faults, after_restart=None) -> None:
    """Each fault in turn, in the middle of the churn: the runtime killed ("kill9": SIGKILL) or
    stopped ("stop": SIGTERM) by its PID, started again, nri-cni resynchronized (then
    `after_restart()`). The last fault also ends the churn: what it cut is the end state."""
    for round_, fault in enumerate(faults):
        churn.wait_created(len(churn.created) + 6)
        if fault == "kill9":
            assert rnode.ctd.kill9() == -signal.SIGKILL
        else:
            rnode.ctd.stop()
        if round_ == len(faults) - 1:
            churn.stopping.set()
        rnode.ctd.start()
        wait_resynchronized(rnode.daemon, round_ + 2)
        if after_restart is not None:
            after_restart()
    churn.stop()


def assert_nothing_left_after_removal(rnode: RecoveryNode, checker: LeakChecker) -> None:
    """Exactly the attachments of the pods containerd has; after their removal, nothing."""
    existing = {p.id for p in rnode.ctd.cri.list_pods()}
    attached = pod_ids_in(rnode.daemon)
    assert set(attached) <= existing, set(attached) - existing
    assert {r.container_id for r in rnode.reservations()} == set(attached)
    assert rnode.intents() == []
    rnode.remove_all_leaving_nothing(existing, checker)


BROKEN_LINE = re.compile(r" id=([0-9a-f]+) is broken \(([a-z-]+)\): ")


def broken_by_name(daemon: NriCni) -> dict[str, str]:
    """pod id -> the code of its "broken" verdict: what `nri-cni status` names ("broken"), or,
    from a daemon whose status does not carry that field, the one log line the verify writes
    as a pod enters the state (a log line naming the pod and the reason)."""
    st = daemon.status()
    if "broken" in st:
        return {b["pod"]: b["code"] for b in st["broken"]}
    text = daemon.log_path.read_text(errors="replace")
    return {m.group(1): m.group(2) for m in BROKEN_LINE.finditer(text)}


def node_truth(rnode: RecoveryNode, interfaces=("eth0",), allowed=("ip-taken",)) -> list[str]:
    """Problems: a READY pod that is not whole and not reported broken for an `allowed` code."""
    broken = broken_by_name(rnode.daemon)
    problems = []
    for pod in rnode.runtime_pods():
        code = broken.get(pod.id)
        if code is not None:
            if code not in allowed:
                problems.append(f"pod {pod.id[:12]} broken for a reason not listed here: {code}")
            continue
        problems += whole_problems(pod, interfaces)
    return problems


def assert_true_within_settle(rnode: RecoveryNode, interfaces=("eth0",), allowed=("ip-taken",)) -> float:
    """The acceptance: the node becomes true again (the check is read-only and repeated only to
    give nri-cni's repair its time; SETTLE is a deadline for a hang); returns the seconds it took."""
    t0 = time.monotonic()
    while True:
        problems = node_truth(rnode, interfaces, allowed)
        if not problems:
            return time.monotonic() - t0
        if time.monotonic() - t0 > SETTLE:
            raise AssertionError(f"still after {SETTLE} s: {problems}\n{_history(rnode, problems)}")
        time.sleep(0.1)


def _history(rnode: RecoveryNode, problems: list[str], per_log: int = 60) -> str:
    """Every line nri-cni's log and the runtime's log have of the pods named in `problems` (the
    last `per_log` of each): what happened to them since they were created, not only lately."""
    pods = set(re.findall(r"pod ([0-9a-f]{12})", " ".join(problems)))
    out = []
    for name, path in (("nri-cni", rnode.daemon.log_path), ("runtime", rnode.ctd.log_path)):
        try:
            lines = [ln for ln in path.read_text(errors="replace").splitlines() if any(p in ln for p in pods)]
        except OSError as exc:
            lines = [f"(unreadable: {exc})"]
        out.append(f"---- {name} log, lines of {sorted(pods)} ({path}):\n" + "\n".join(lines[-per_log:]))
    return "\n".join(out)


def assert_pods_reach_each_other(rnode: RecoveryNode, whole: list[RuntimePod]) -> None:
    """A pod created now (the node takes new pods) pings every whole READY pod, all on the test's
    bridge; it is removed again."""
    fresh_id = rnode.run_pod(f"fresh-{uuid.uuid4().hex[:6]}", ports=False)
    try:
        st = rnode.ctd.cri.pod_status(fresh_id)
        fresh = RuntimePod(fresh_id, st.netns_path or "", st.ips)
        assert whole_problems(fresh, ["eth0"]) == []
        silent = [p.id[:12] for p in whole if p.id != fresh_id and not reaches(fresh, p.ips[0])]
        assert silent == [], f"no answer from {silent} to a ping from a new pod"
        assert whole, "no READY pod left to ping"
    finally:
        rnode.remove_pod(fresh_id)
