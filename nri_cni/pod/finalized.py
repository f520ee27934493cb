"""Secondary mode: which pods have had the FINALIZE of the runtime's own primary network.

The runtime's eth0 is not nri-cni's attachment, so nri-cni's cache says nothing about it. Its
FINALIZE runs once per pod, with or without extra networks: a repeated
RunPodSandbox, a repair after Synchronize or after a restart of nri-cni must not run it again.
One small file per pod, `<state_dir>/finalized/<pod id>`, holds the pod's netns path; it goes
when the pod is detached, and GC drops the marks of pods the runtime no longer lists or whose
netns is gone (the rules GC applies to cache entries).

A mark is written without fsync: lost in a power cut it costs one repeated FINALIZE of a pod
that survived a reboot of the node (which it does not: its netns is gone), while an fsync would
sit on every pod's RunPodSandbox.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

from nri_cni.pod.upkeep import netns_gone
from nri_cni.safety import validate
from nri_cni.safety.files import is_temporary, write_atomic

log = logging.getLogger("nri_cni.pod")


class FinalizedMarks:
    def __init__(self, state_dir: str) -> None:
        self.dir = os.path.join(state_dir, "finalized")
        self._made = False

    def _path(self, pod_id: str) -> str:
        validate.check_id(pod_id, "pod id")  # a file name: never a path
        return os.path.join(self.dir, pod_id)

    def done(self, pod_id: str) -> bool:
        return os.path.exists(self._path(pod_id))

    def mark(self, pod_id: str, netns: str) -> None:
        if not self._made:
            os.makedirs(self.dir, mode=0o700, exist_ok=True)
            self._made = True
        write_atomic(self._path(pod_id), netns.encode(), durable=False)

    def forget(self, pod_id: str) -> None:
        try:
            os.unlink(self._path(pod_id))
        except FileNotFoundError:
            pass

    def all(self) -> dict[str, str]:
        """Every mark: pod id -> netns path (temporary files of a crashed write go)."""
        try:
            names = os.listdir(self.dir)
        except FileNotFoundError:
            return {}
        out = {}
        for name in names:
            path = os.path.join(self.dir, name)
            try:
                if is_temporary(name):
                    os.unlink(path)
                    continue
                with open(path, encoding="utf-8", errors="replace") as f:
                    out[name] = f.read()
            except OSError as exc:
                log.warning("finalize mark %s unreadable: %s", path, exc)
        return out

    def drop_gone(self, valid: set[str] | Callable[[], set[str]]) -> None:
        """GC: the marks of pods not in `valid` (GC's valid pod ids, or the function giving
        them), or whose netns is gone."""
        marks = self.all()
        if not marks:
            return
        ids = valid() if callable(valid) else valid
        for pod_id, netns in marks.items():
            if pod_id not in ids or netns_gone(netns):
                self.forget(pod_id)
