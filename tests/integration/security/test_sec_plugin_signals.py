"""A daemon started under nohup by a supervisor that ignores and blocks more signals: the
plugins it runs start with every signal at its default disposition and none blocked (an
ignored signal passes through exec to the plugin and to what the plugin runs)."""

from __future__ import annotations

import os
import signal
import sys

import pytest
import yaml

from tests.support.bin_dir import install_plugin
from tests.support.conflists import conflist, network
from tests.support.harness import new_pod_id, pod_message, run
from tests.support.nri_runtime import NriRuntime

pytestmark = pytest.mark.netns

# What the supervisor leaves the daemon: these ignored (nohup adds SIGHUP), SIGUSR1 blocked;
# then it execs the rest of its argv.
IGNORED = (signal.SIGINT, signal.SIGQUIT, signal.SIGUSR2, signal.SIGRTMIN + 1)
SUPERVISOR = f"""
import os, signal, sys
for sig in {[int(s) for s in IGNORED]}:
    signal.signal(sig, signal.SIG_IGN)
signal.pthread_sigmask(signal.SIG_BLOCK, {{signal.SIGUSR1}})
os.execvp(sys.argv[1], sys.argv[1:])
"""

# Not Python: Python ignores SIGPIPE and SIGXFSZ itself at start-up. grep reports what the sh
# was started with (an ignored or blocked signal stays so through fork and exec).
PROBE_PLUGIN = """#!/bin/sh
case "$CNI_COMMAND" in
ADD) grep -E '^Sig(Ign|Blk):' /proc/self/status > "{dump}"; echo '{{"cniVersion":"1.1.0"}}' ;;
VERSION) echo '{{"cniVersion":"1.1.0","supportedVersions":["1.0.0","1.1.0"]}}' ;;
esac
"""


def signals(mask: str) -> set[int]:
    """The signals of a /proc status mask, but glibc's internal 32 and 33 (its posix_spawn
    leaves them as they were; glibc and Go install their own handlers for them)."""
    bits = int(mask, 16)
    return {n for n in range(1, 65) if bits >> (n - 1) & 1 and n not in (32, 33)}


def test_a_daemon_started_under_nohup_runs_plugins_with_no_signal_ignored_or_blocked(node, tmp_path):
    ns = node.jan.netns()
    dump = tmp_path / "sigstate"
    install_plugin(node.bin_dir, "sig-probe", PROBE_PLUGIN.format(dump=dump))
    nets = [network(conflist("podnet", {"type": "sig-probe"}))]
    config_path = tmp_path / "config.yaml"
    config_path.write_text(yaml.safe_dump(node.config("native", nets)))
    daemon = [sys.executable, "-m", "nri_cni.cli", "run", "--config", str(config_path)]

    async def scenario():
        runtime = NriRuntime(None, request_timeout_ms=20000)
        try:
            env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": os.pathsep.join(sys.path)}
            proc = await runtime.launch(
                [sys.executable, "-c", SUPERVISOR, "nohup", *daemon], name="cni", idx="10", env=env
            )
            await runtime.wait_plugin(timeout=20)
            # the control: the daemon itself did inherit them (those it does not handle)
            with open(f"/proc/{proc.pid}/status") as f:
                own = dict(line.rstrip("\n").split(":\t", 1) for line in f if line.startswith("Sig"))
            assert {int(signal.SIGQUIT), int(signal.SIGUSR2), int(signal.SIGRTMIN) + 1} <= signals(
                own["SigIgn"]
            )
            assert int(signal.SIGUSR1) in signals(own["SigBlk"])
            pod = pod_message(new_pod_id(), ns.path)
            await runtime.run_pod_sandbox(pod)
            await runtime.stop_pod_sandbox(pod)
        finally:
            await runtime.stop()

    run(scenario())
    seen = dict(line.split(":\t") for line in dump.read_text().splitlines())
    assert signals(seen["SigIgn"]) == set()
    assert signals(seen["SigBlk"]) == set()
