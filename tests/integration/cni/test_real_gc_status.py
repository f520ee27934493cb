"""GC and STATUS with the real bridge + host-local.

What the 1.9.1 plugins do (read in containernetworking/plugins v1.9.1):
- host-local registers Add/Check/Del only ("FIXME GC", "FIXME Status"); for a registered-less
  verb skel's checkVersionAndCall returns success, so host-local's GC and STATUS always succeed.
  Its reservations are released only by DEL, i.e. by the cache-driven DELs of GC.
- bridge's STATUS delegates to its IPAM plugin's STATUS (ipam.ExecStatus) and returns that error;
  a plain Go error is wrapped by skel as code 999 (ErrInternal).
"""

from __future__ import annotations

import pytest

from tests.integration.cni.helpers import CniEnv, run
from tests.support.conflists import bridge_plugin
from tests.support.hostlocal import host_local_reservations
from tests.support.names import unique_name

pytestmark = pytest.mark.netns


def _bridge_net(env: CniEnv, bridge: str, **ipam):
    return env.net(env.conflist(bridge_plugin(bridge, env.host_local(**ipam), gateway=False)))


def test_gc_releases_everything_but_the_valid_attachment(cni_env: CniEnv):
    from nri_cni.cni.runtime import Attachment

    env = cni_env
    bridge = unique_name("br")
    env.jan.track_link(bridge)
    net = _bridge_net(env, bridge)
    rt = env.runtime()
    pods = [(env.cid, env.ns)] + [(env.new_cid(), env.new_netns()) for _ in range(2)]
    leaks = env.leak_checker(
        bridges=[bridge], netns=[ns for _, ns in pods], markers=[cid for cid, _ in pods]
    ).start()

    ips = {}
    for cid, ns in pods:
        result = run(rt.add(net, env.rtconf(cid=cid, ns=ns)))
        ips[cid] = result.ips[0].address.split("/")[0]
    leaks.learn()
    assert len(leaks.host_links) == 3
    assert {r.container_id for r in host_local_reservations(env.data_dir)} == set(ips)
    assert len(rt.cache.entries(network=net.name)) == 3

    keep_cid, keep_ns = pods[0]
    run(rt.gc(net, [Attachment(keep_cid, "eth0")]))

    # the valid attachment is untouched: reservation, cache entry, interface
    assert [(r.container_id, r.ip) for r in host_local_reservations(env.data_dir)] == [
        (keep_cid, ips[keep_cid])
    ]
    assert [(e.container_id, e.ifname) for e in rt.cache.entries(network=net.name)] == [(keep_cid, "eth0")]
    assert env.cache_files() == [f"{net.name}-{keep_cid}-eth0"]
    assert keep_ns.link("eth0") is not None
    # the two others were DEL'd: their interfaces are gone too
    for cid, ns in pods[1:]:
        assert [li.name for li in ns.links()] == ["lo"], f"{cid} still attached"

    run(rt.check(net, env.rtconf(cid=keep_cid, ns=keep_ns)))
    run(rt.delete(net, env.rtconf(cid=keep_cid, ns=keep_ns)))
    leaks.assert_clean()


def test_gc_without_valid_attachments_collects_all(cni_env: CniEnv):
    env = cni_env
    bridge = unique_name("br")
    env.jan.track_link(bridge)
    net = _bridge_net(env, bridge)
    rt = env.runtime()
    leaks = env.leak_checker(bridges=[bridge]).start()
    run(rt.add(net, env.rtconf()))
    leaks.learn()
    run(rt.gc(net, []))
    assert host_local_reservations(env.data_dir) == []
    leaks.assert_clean()


def test_status_of_an_exhausted_range(cni_env: CniEnv):
    from nri_cni.errors import CNIError

    env = cni_env
    bridge = unique_name("br")
    env.jan.track_link(bridge)
    only = env.host(10)
    net = _bridge_net(env, bridge, range={"rangeStart": only, "rangeEnd": only})
    rt = env.runtime()
    other_ns = env.new_netns()
    other_cid = env.new_cid()
    leaks = env.leak_checker(bridges=[bridge], netns=[env.ns, other_ns], markers=[other_cid]).start()

    run(rt.status(net))  # ready while the range is free
    result = run(rt.add(net, env.rtconf()))
    assert result.ips[0].address == f"{only}/24"
    leaks.learn()

    # host-local 1.9.1 has no STATUS, so the exhausted range does not show in STATUS:
    run(rt.status(net))

    # ... it shows at the next ADD, with host-local's message and code, through bridge
    with pytest.raises(CNIError) as ei:
        run(rt.add(net, env.rtconf(cid=other_cid, ns=other_ns)))
    err = ei.value
    assert err.code == 999, err  # skel wraps host-local's Go error as ErrInternal
    assert "no IP addresses available in range set" in err.msg, err
    assert (err.ref.plugin, err.ref.command, err.ref.network) == ("bridge", "ADD", net.name)
    # bridge 1.9.1 releases the address but keeps the veth until the DEL that SPEC requires after
    # a failed ADD (below); nri-cni cached nothing for the failed ADD
    assert not (env.cache_dir / "results" / f"{net.name}-{other_cid}-eth0").exists()
    assert [r.container_id for r in host_local_reservations(env.data_dir)] == [env.cid]

    run(rt.delete(net, env.rtconf(cid=other_cid, ns=other_ns)))  # the DEL owed to a failed ADD
    assert [li.name for li in other_ns.links()] == ["lo"]
    run(rt.delete(net, env.rtconf()))
    run(rt.status(net))
    leaks.assert_clean()


def test_status_reports_the_plugin_error_with_its_code(cni_env: CniEnv):
    """A STATUS that fails in a real plugin: bridge cannot find its IPAM plugin."""
    from nri_cni.errors import CNIError

    env = cni_env
    net = env.net(
        env.conflist(
            {
                "type": "bridge",
                "bridge": unique_name("br"),
                "ipMasq": False,
                "ipam": {"type": "nct-no-such-ipam"},
            }
        )
    )
    with pytest.raises(CNIError) as ei:
        run(env.runtime().status(net))
    err = ei.value
    assert err.code == 999, err
    assert 'failed to find plugin "nct-no-such-ipam"' in err.msg, err
    assert (err.ref.plugin, err.ref.command, err.ref.network) == ("bridge", "STATUS", net.name)


def test_status_below_1_1_0_is_ready_without_running_anything(cni_env: CniEnv):
    env = cni_env
    conf = env.conflist({"type": "nct-no-such-plugin"})
    conf["cniVersion"] = "1.0.0"
    run(env.runtime().status(env.net(conf)))  # libcni: STATUS needs 1.1.0, below is success
