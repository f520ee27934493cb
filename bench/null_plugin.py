#!/usr/bin/env python3
"""The floor of a shim set-up: a daemon and an NRI plugin that do nothing.

Every set-up where the runtime's CNI is forwarded to a daemon, and the daemon hears the pod's NRI
events, pays for the shim's exec, its stdin, its socket round trip and its exit, and for one NRI
round trip per pod event, whatever the daemon does. The benches' floor modes measure that part
alone (bench_pods.py `floor`, bench_crio.py `crio-floor`, bench_attach.py `floor3`): the runtime
runs its own list with the compiled `nri-cni-shim` chained after its last plugin, pointed at
this process, which

  - answers the shim at once: an ADD with the prevResult it was given (the chain's result as
    the runtime's own plugins made it), DEL and CHECK with nothing, a status 0 either way;
  - registers on the runtime's NRI socket through nri-cni's stub, subscribed to what nri-cni
    subscribes to for a pod (RunPodSandbox, StopPodSandbox, RemovePodSandbox), answering each
    with nothing.

It prints "ready" once both are serving; SIGTERM or SIGINT stops it.
Run:  python bench/null_plugin.py --nri-socket PATH --socket PATH
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from nri_cni.api import nri_pb2  # noqa: E402
from nri_cni.local import proto as localproto  # noqa: E402
from nri_cni.nri.handlers import Handlers  # noqa: E402
from nri_cni.nri.stub import Stub  # noqa: E402


def answer(env: dict[str, str], body: bytes) -> tuple[int, bytes]:
    """The shim's answer: (status, payload). An ADD without a prevResult is refused with a
    CNI error (the shim was not chained after a plugin), as is a command this floor has no
    answer for."""
    command = env.get("CNI_COMMAND", "")
    if command in ("DEL", "CHECK", "GC", "STATUS"):
        return localproto.STATUS_OK, b""
    conf = json.loads(body or b"{}")
    if command == "ADD" and isinstance(conf.get("prevResult"), dict):
        return localproto.STATUS_OK, json.dumps(conf["prevResult"]).encode()
    error = {
        "cniVersion": conf.get("cniVersion", "1.0.0"),
        "code": 4,
        "msg": f"null plugin: no answer to {command!r}",
    }
    return localproto.STATUS_ERROR, json.dumps(error).encode()


async def serve_shim(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        env, body = await localproto.read_request(reader)
        status, payload = answer(env, body)
        writer.write(localproto.encode_response(status, payload))
        await writer.drain()
    finally:
        writer.close()


async def nothing(pod: nri_pb2.PodSandbox) -> None:
    return None


async def main_async(args: argparse.Namespace) -> int:
    server = await asyncio.start_unix_server(serve_shim, path=args.socket)
    stub = Stub(
        Handlers(run_pod_sandbox=nothing, stop_pod_sandbox=nothing, remove_pod_sandbox=nothing),
        name="null-floor",
        idx="90",
        socket_path=args.nri_socket,
        reconnect=False,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    serving = asyncio.ensure_future(stub.run())
    stopped = asyncio.ensure_future(stop.wait())
    registered = asyncio.ensure_future(stub.synchronized.wait())
    await asyncio.wait({serving, stopped, registered}, return_when=asyncio.FIRST_COMPLETED)
    if registered.done():
        print("ready", flush=True)
        await asyncio.wait({serving, stopped}, return_when=asyncio.FIRST_COMPLETED)
    registered.cancel()
    await stub.stop()
    server.close()
    why = "it closed"
    try:
        await serving
    except Exception as exc:  # the runtime not reachable, or the connection refused
        why = str(exc)
    stopped.cancel()
    if not stop.is_set():
        print(f"null plugin: the NRI connection ended: {why}", file=sys.stderr, flush=True)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nri-socket", required=True, help="the runtime's NRI socket")
    ap.add_argument("--socket", required=True, help="where the chained shim connects")
    return asyncio.run(main_async(ap.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
