"""A daemon built and never started, for the service's tests without root: its network's plugin
does not exist, and a fake node inspector answers for netlink."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from nri_cni.config import parse_config
from nri_cni.daemon.app import Daemon, build_daemon
from nri_cni.node import Difference, Expectation, Finding, FindingKind
from nri_cni.pod.model import PodInfo

NET = {"cniVersion": "1.1.0", "name": "podnet", "plugins": [{"type": "ncver-none"}]}


def daemon_for(tmp_path: Path, **extra: Any) -> Daemon:
    """A native-mode daemon, built and never started, over a network whose plugin does not exist."""
    doc = {
        "mode": "native",
        "state_dir": str(tmp_path / "state"),
        "nri": {"socket": str(tmp_path / "nri.sock")},
        "daemon": {"socket": str(tmp_path / "daemon.sock")},
        "cni": {"cache_dir": str(tmp_path / "cache"), "bin_dirs": [str(tmp_path / "bin")]},
        "networks": [{"name": "podnet", "default": True, "conflist": NET}],
        "gc": {"interval": 0},
        "status": {"interval": 0},
        "repair_on_sync": False,
        **extra,
    }
    return build_daemon(parse_config(doc, str(tmp_path / "config.yaml")))


# A plugin result for pod n once "{n}" is filled in.
RESULT = {
    "cniVersion": "1.1.0",
    "interfaces": [{"name": "eth0", "sandbox": "/x", "mac": "02:00:00:00:00:01"}],
    "ips": [{"address": "10.9.0.{n}/24", "interface": 0}],
}


class FakeInspector:
    """What NodeInspector answers: per expectation, a finding; `unreadable` names the keys
    whose netns (or host links, with `host=True`) netlink could not read."""

    def __init__(self, netns: set[str], host: set[str]) -> None:
        self.netns, self.host = netns, host

    async def inspect(self, exps: Sequence[Expectation]) -> list[Finding]:
        out = []
        for e in exps:
            pod = e.key.split("/")[0]
            if pod in self.netns:
                why = f"cannot read netns {e.netns}: [Errno 13] Permission denied"
                out.append(Finding(e, (Difference(FindingKind.UNREADABLE, why),)))
            elif pod in self.host:
                out.append(Finding(e, (Difference(FindingKind.UNREADABLE, "cannot read host links: EIO"),)))
            else:
                out.append(Finding(e))
        return out

    def close(self) -> None:
        pass


def verify_pod(n: int, netns: Path) -> PodInfo:
    """Pod number `n` (its IP 10.9.0.n, as RESULT with n filled in) with its netns at `netns`."""
    return PodInfo(
        f"{n:x}" * 64, name=f"ncver-{n}", namespace="ncver", netns=str(netns), ips=(f"10.9.0.{n}",)
    )
