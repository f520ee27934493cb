"""The shim's CHECK and GC: the shim exec'd as a runtime execs a CNI plugin
(only CNI_* and PATH, the config on stdin), real bridge + host-local + portmap behind it, and the
CNI version rule of CHECK (a list below 0.4.0 has no CHECK) through the same path."""

from __future__ import annotations

import asyncio

import pytest

from tests.support.harness import DaemonHarness, new_pod_id, pod_message, run
from tests.support.secharness import BUILDS, call_shim, install_shim, runtime_conf

pytestmark = pytest.mark.netns


def _cached(node) -> list[str]:
    results = node.cache_dir / "results"
    return sorted(p.name for p in results.iterdir()) if results.exists() else []


@BUILDS
def test_shim_check_passes_then_names_the_damage_and_gc_deletes_what_the_runtime_does_not_list(
    node, compiled
):
    ns_a, ns_b = node.jan.netns(), node.jan.netns()
    cfg = node.config(
        "shim", [{"name": "podnet", "default": True, "conflist": node.bridge_net("podnet", "10.244.43.0/24")}]
    )
    a, b = new_pod_id(), new_pod_id()
    checker = node.leak_checker(ns_a, ns_b).start()

    async def scenario():
        async with DaemonHarness(node, cfg) as h:
            shim = install_shim(node, compiled)
            for cid, ns in ((a, ns_a), (b, ns_b)):
                code, out, raw = await call_shim(shim, "ADD", cid, netns=ns.path)
                assert code == 0 and out["ips"], raw

            # CHECK of an intact pod right after its ADD: answered from the records, netlink
            # agreeing (exit 0, no output); the next one runs the chain's: every plugin agrees
            for _ in range(2):
                code, out, raw = await call_shim(shim, "CHECK", a, netns=ns_a.path)
                assert (code, raw) == (0, b""), raw

            # b's eth0 deleted behind everyone's back: the chain's own CHECK (bridge's) says
            # so, as the plugin's CNI error, through the shim
            await asyncio.to_thread(ns_b.run, "ip", "link", "del", "eth0")
            code, out, raw = await call_shim(shim, "CHECK", b, netns=ns_b.path)
            assert code != 0 and out is not None, raw
            assert out["code"] == 999 and "eth0 not found" in out["msg"], out

            # The runtime lists both pods (a new Synchronize): neither is "just attached" now, so
            # the runtime's own GC of the shim's network decides what is valid
            h.runtime.pods = [pod_message(a, ns_a.path), pod_message(b, ns_b.path)]
            await h.runtime.close()
            await h.runtime.wait_plugin(2)
            await h.settle()
            assert len(_cached(node)) == 2
            valid = [{"containerID": a, "ifname": "eth0"}]
            code, _, raw = await call_shim(
                shim, "GC", "", conf=runtime_conf(**{"cni.dev/valid-attachments": valid})
            )
            assert code == 0, raw
            assert [name for name in _cached(node) if b in name] == []  # b: DEL'd, its IP released
            assert len(_cached(node)) == 1 and len(node.reservations()) == 1
            code, _, raw = await call_shim(shim, "CHECK", a, netns=ns_a.path)
            assert code == 0, raw  # a untouched

            code, _, raw = await call_shim(shim, "DEL", a, netns=ns_a.path)
            assert code == 0, raw

    run(scenario())
    assert node.reservations() == [] and _cached(node) == []
    assert checker.leaks() == []


def test_shim_check_of_a_list_below_0_4_0_is_refused_with_code_1(node):
    """CNI's CHECK exists from 0.4.0 on: a 0.3.1 list is refused before any plugin runs (code 1,
    incompatible version) and the pod stays as it is."""
    ns = node.jan.netns()
    conflist = {**node.bridge_net("oldnet", "10.244.44.0/24"), "cniVersion": "0.3.1"}
    conflist["plugins"] = conflist["plugins"][:1]  # portmap needs 0.4.0 features: the bridge alone
    cfg = node.config("shim", [{"name": "oldnet", "default": True, "conflist": conflist}])
    cid = new_pod_id()
    checker = node.leak_checker(ns).start()

    async def scenario():
        async with DaemonHarness(node, cfg):
            shim = install_shim(node, True)
            code, out, raw = await call_shim(shim, "ADD", cid, netns=ns.path)
            assert code == 0 and out["ips"], raw
            code, out, raw = await call_shim(shim, "CHECK", cid, netns=ns.path)
            assert code != 0 and out is not None, raw
            assert out["code"] == 1 and "does not support the CHECK command" in out["msg"], out
            assert await asyncio.to_thread(ns.link, "eth0") is not None
            code, _, raw = await call_shim(shim, "DEL", cid, netns=ns.path)
            assert code == 0, raw

    run(scenario())
    assert node.reservations() == [] and _cached(node) == []
    assert checker.leaks() == []
