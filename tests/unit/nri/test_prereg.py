"""Pre-registered launch: the runtime starts the plugin with a socketpair end as fd 3."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from nri_cni.api import nri_pb2
from tests.support.nri_runtime import NriRuntime

# A plugin executable as the runtime would find it in /opt/nri/plugins ("NN-name").
PLUGIN = f"""#!{sys.executable}
import asyncio, logging, sys
from nri_cni.api import nri_pb2
from nri_cni.nri.stub import Stub

class Plugin:
    async def run_pod_sandbox(self, pod):
        net = nri_pb2.PodSandboxNetwork(ips=["10.245.0." + pod.name.rsplit("-", 1)[1]])
        return nri_pb2.RunPodSandboxResponse(adjust=nri_pb2.PodSandboxAdjustment(network=net))

async def main():
    stub = Stub(Plugin(), name="unused", idx="99", socket_path="/nonexistent")
    await stub.run()  # returns once the runtime closes the socket
    print("config:", stub.config, flush=True)

logging.basicConfig(level=logging.INFO)
asyncio.run(main())
"""


def plugin_file(tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    path.write_text(PLUGIN)
    path.chmod(0o755)
    return path


async def launch_and_run(runtime: NriRuntime, argv, **kw):
    proc = await runtime.launch(argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, **kw)
    conn = await runtime.wait_plugin(timeout=20)
    resp = await runtime.run_pod_sandbox(nri_pb2.PodSandbox(id="p", name="pod-17"))
    await runtime.close()  # the runtime goes away: a pre-registered plugin exits
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    return conn, resp, proc.returncode, out.decode(), err.decode()


def test_env_names_the_plugin(arun, tmp_path):
    async def main():
        runtime = NriRuntime(config="from /etc/nri/conf.d/05-cni.conf")
        try:
            conn, resp, rc, out, err = await launch_and_run(
                runtime, [str(plugin_file(tmp_path, "70-ignored"))], name="cni", idx="05"
            )
        finally:
            await runtime.stop()
        assert (conn.name, conn.idx) == ("cni", "05"), err
        assert list(resp.adjust.network.ips) == ["10.245.0.17"]
        assert rc == 0, err
        assert "config: from /etc/nri/conf.d/05-cni.conf" in out

    arun(main(), timeout=40)


def test_argv0_names_the_plugin(arun, tmp_path):
    async def main():
        runtime = NriRuntime()
        try:
            conn, resp, rc, _, err = await launch_and_run(runtime, [str(plugin_file(tmp_path, "10-nct-cni"))])
        finally:
            await runtime.stop()
        assert (conn.name, conn.idx) == ("nct-cni", "10"), err
        assert list(resp.adjust.network.ips) == ["10.245.0.17"]
        assert rc == 0, err

    arun(main(), timeout=40)
