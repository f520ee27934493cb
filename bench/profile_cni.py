#!/usr/bin/env python3
"""Where nri-cni's own time per plugin call goes: a cProfile of CNIRuntime ADD + DEL on the no-op
chain (three static C plugins that print their prevResult, bench_cni.py's), each function's own
time put in one of a few buckets:

  plugin        waiting for the plugin (epoll) and its posix_spawn: the exec floor pays these too
  event loop    asyncio's loop, handles, futures, selector registration, contextvars
  child fds     the child's stdin memfd, stdout/stderr pipes, pidfd, reads, closes, reaping
  JSON          stdin encoding, result parsing into the 1.1.0 model and back
  cache         the libcni-layout cache file: write (ADD), read and unlink (DEL)
  lookup        finding the plugin binary in the bin dirs
  other         the rest of nri-cni's CNI runtime (conf injection, env, verbs)

cProfile slows Python code, not the plugins, so the buckets are shares, not times: `--json`
and `shares()` give each bucket's share of nri-cni's own (non-plugin) time. bench/__main__.py
quotes them next to the own-cost row.
Run:  python bench/profile_cni.py [--pods 200]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import pstats
import shutil
import sys
import tempfile
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

BUCKETS = ("event loop", "child fds", "JSON", "cache", "lookup", "other")
_FD_CALLS = (
    "memfd_create",
    "pipe",
    "pipe2",
    "close",
    "pidfd_open",
    "write",
    "read",
    "lseek",
    "set_blocking",
    "waitpid",
    "waitid",
    "setpriority",
    "fcntl",
)


def _bucket(filename: str, name: str) -> str | None:
    """The bucket of one profiled function (None: the plugin's own time)."""
    if name in ("<method 'poll' of 'select.epoll' objects>", "<built-in method posix.posix_spawn>"):
        return None
    if "nri_cni/cni/cache" in filename or name in (
        "<built-in method io.open>",
        "<built-in method posix.fsync>",
        "<built-in method posix.rename>",
        "<built-in method posix.replace>",
        "<built-in method posix.unlink>",
        "<method 'read' of '_io.BufferedReader' objects>",
    ):
        return "cache"
    if "nri_cni/cni/plugin_process" in filename or any(f"posix.{c}>" in name for c in _FD_CALLS):
        return "child fds"
    if "/json/" in filename or "result" in filename.rsplit("/", 1)[-1] or "plugin_io" in filename:
        return "JSON"
    if ("nri_cni/cni/exec" in filename and name == "find") or "posixpath" in filename or "lstat" in name:
        return "lookup"
    if "asyncio" in filename or "selectors" in filename or "contextvars" in name or "_contextvars" in name:
        return "event loop"
    return "other"


def profile_noop(bin_dir: str, pods: int, cache_dir: str) -> dict[str, float]:
    """ADD + DEL of `pods` attachments on the no-op chain under cProfile; each bucket's share
    (0..1) of nri-cni's own time (the plugin's time left out)."""
    from nri_cni.cli.gctune import tune_gc
    from nri_cni.cni.config import parse_conflist
    from nri_cni.cni.exec import PluginExecutor
    from nri_cni.cni.runtime import CNIRuntime, RuntimeConf

    conflist = {
        "cniVersion": "1.1.0",
        "name": "nct-prof-noop",
        "plugins": [{"type": "noop1"}, {"type": "noop2"}, {"type": "noop3"}],
    }
    net = parse_conflist(json.dumps(conflist).encode(), source="profile_cni")
    rt = CNIRuntime([bin_dir], cache_dir=cache_dir, executor=PluginExecutor())
    prof = cProfile.Profile()

    async def run() -> None:
        tune_gc()
        confs = [
            RuntimeConf(
                container_id=f"nct-prof-{uuid.uuid4().hex[:16]}",
                netns="/var/run/netns/nct-prof-none",  # the no-op plugins never enter it
                ifname="eth0",
                args=[("K8S_POD_NAMESPACE", "bench")],
                capability_args={},
            )
            for _ in range(pods + 10)
        ]
        for c in confs[:10]:  # warm-up, not profiled
            await rt.add(net, c)
            await rt.delete(net, c)
        prof.enable()
        for c in confs[10:]:
            await rt.add(net, c)
            await rt.delete(net, c)
        prof.disable()

    asyncio.run(run())
    rt.cache.flush()
    stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    own = dict.fromkeys(BUCKETS, 0.0)
    for (filename, _line, name), (_cc, _nc, tottime, _ct, _callers) in stats.items():
        b = _bucket(filename, name)
        if b is not None:
            own[b] += tottime
    total = sum(own.values()) or 1.0
    return {b: own[b] / total for b in BUCKETS}


def describe(shares: dict[str, float]) -> str:
    return ", ".join(f"{b} {shares[b] * 100:.0f}%" for b in sorted(shares, key=lambda b: -shares[b]))


def main(argv: list[str] | None = None) -> int:
    from bench.bench_cni import build_noop

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pods", type=int, default=200)
    ap.add_argument("--json", help="write the shares here")
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="nct-prof-", dir="/dev/shm"))
    try:
        shares = profile_noop(build_noop(work), args.pods, str(work / "cache"))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"nri-cni's own time per plugin call (no-op chain, {args.pods} ADD+DEL): {describe(shares)}")
    if args.json:
        Path(args.json).write_text(json.dumps(shares, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
