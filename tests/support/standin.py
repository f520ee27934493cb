"""A network namespace standing in for the host, for the plugins that write the host's firewall
(the bridge's `ipMasq`): the machine's own netns must never get a masquerade rule of a test.

`run_in_netns` runs a function on a thread of its own inside the stand-in (nri-cni's one way
into a netns, `nri_cni.node.workers.enter`): every plugin that function's event loop starts,
and every thread it makes (nri-cni's netns workers, asyncio's executor), starts there, so the
bridge, the veths' host ends and the nat rules are made inside the stand-in, and nri-cni's
host-side reader reads them there. The thread is back in the machine's netns when it ends.

`machine_nat_mentions` is the guard: the machine's own nat rules (iptables, ip6tables, nft)
that mention any of the given words (the test's subnets, its pods' ids).
`masq_rules`, `drop_masq` and `flush_masq` read and damage the stand-in's masquerade rules with
the tools an admin or a firewall reload uses, not with nri-cni's reader.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import threading
from collections.abc import Callable, Iterable
from typing import TypeVar

from nri_cni.node.workers import enter
from tests.support.netns import Netns

T = TypeVar("T")
MASQ_TABLE = ("inet", "cni_plugins_masquerade")  # the plugins' nftables masquerade (plugins 1.9)


def _netns_inode(path: str) -> int:
    return os.stat(path).st_ino


def run_in_netns(ns: Netns, fn: Callable[[], T]) -> T:
    """`fn()` on a thread of its own inside `ns`; its result, or its exception raised here."""
    box: dict[str, object] = {}
    machine = _netns_inode(f"/proc/self/task/{threading.get_native_id()}/ns/net")  # the caller's

    def inside() -> T:
        here = _netns_inode(f"/proc/self/task/{threading.get_native_id()}/ns/net")
        if here != _netns_inode(ns.path) or here == machine:
            raise AssertionError(f"not inside the stand-in {ns.name}: nothing is run")
        return fn()

    def work() -> None:
        home = os.open(f"/proc/self/task/{threading.get_native_id()}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        try:
            box["result"] = enter(ns.path, home, inside)
        except BaseException as exc:
            box["error"] = exc
        finally:
            os.close(home)

    thread = threading.Thread(target=work, name=f"standin-{ns.name}")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["result"]  # type: ignore[return-value]


def machine_nat_mentions(words: Iterable[str]) -> list[str]:
    """The machine's own (this thread's: the test's) nat rules and nft rules mentioning a word."""
    words = [w for w in words if w]
    texts = [
        subprocess.run([tool, "-t", "nat"], capture_output=True, text=True, check=True).stdout
        for tool in ("iptables-save", "ip6tables-save")
    ]
    texts.append(
        subprocess.run(["nft", "list", "ruleset"], capture_output=True, text=True, check=True).stdout
    )
    return [line for text in texts for line in text.splitlines() if any(w in line for w in words)]


def masq_rules(ns: Netns, backend: str, pod_id: str) -> set[str]:
    """The addresses the stand-in masquerades for `pod_id`: iptables, a POSTROUTING rule `-s`
    that address commented with the id, jumping to a chain that masquerades; nftables, a rule of
    the plugins' table with `saddr` that address, `masquerade` and the id in its comment."""
    found: set[str] = set()
    if backend == "iptables":
        for tool in ("iptables-save", "ip6tables-save"):
            lines = ns.run(tool, "-t", "nat").stdout.splitlines()
            masquerading = {ln.split()[1] for ln in lines if ln.startswith("-A ") and "-j MASQUERADE" in ln}
            for ln in lines:
                m = re.match(r"-A POSTROUTING -s (\S+)/\d+ .*-j (\S+)$", ln)
                if m and f'id: \\"{pod_id}\\"' in ln and m.group(2) in masquerading:
                    found.add(m.group(1))
        return found
    listing = ns.run("nft", "list", "table", *MASQ_TABLE, check=False).stdout
    for ln in listing.splitlines():
        m = re.search(r"\bip6? saddr (\S+) .*\bmasquerade\b", ln)
        if m and f"id: {pod_id}" in ln:
            found.add(m.group(1))
    return found


def drop_masq(ns: Netns, backend: str, pod_id: str) -> None:
    """One pod's masquerade rules deleted (an admin's doing), the other pods' left alone."""
    if backend == "iptables":
        for tables in ("iptables", "ip6tables"):
            for ln in ns.run(f"{tables}-save", "-t", "nat").stdout.splitlines():
                if ln.startswith("-A POSTROUTING ") and f'id: \\"{pod_id}\\"' in ln:
                    ns.run("sh", "-c", f"{tables} -t nat -D {ln[3:]}")
    else:
        listing = ns.run("nft", "-a", "list", "chain", *MASQ_TABLE, "masq_checks").stdout
        for handle in re.findall(rf"id: {pod_id}.*# handle (\d+)", listing):
            ns.run("nft", "delete", "rule", *MASQ_TABLE, "masq_checks", "handle", handle)
    assert masq_rules(ns, backend, pod_id) == set()


def flush_masq(ns: Netns, backend: str) -> None:
    """What a firewall reload does to the stand-in: its nat tables flushed (iptables), its whole
    nft ruleset flushed (nftables)."""
    if backend == "iptables":
        ns.run("iptables", "-t", "nat", "-F")
        ns.run("ip6tables", "-t", "nat", "-F")
    else:
        ns.run("nft", "flush", "ruleset")


def chains_for_plugin_del(ns: Netns, network: str, pod_ids: Iterable[str]) -> None:
    """The empty iptables chains (`CNI-<hash of network and id>`, both families) the bridge
    plugin 1.9.1's DEL deletes whatever its masquerade backend: iptables-nft answers a rule
    jumping to a chain that is not there with "Chain ... does not exist" (exit 2), which the
    plugin does not take for "already gone", so without them its DEL fails (docs/reliability.md,
    known limits)."""
    for pod_id in pod_ids:
        chain = "CNI-" + hashlib.sha512(f"{network}{pod_id}".encode()).hexdigest()[:24]
        for tool in ("iptables", "ip6tables"):
            if ns.run(tool, "-t", "nat", "-S", chain, check=False).returncode != 0:
                ns.run(tool, "-t", "nat", "-N", chain)
