"""The janitor: makes namespaces, bridges, veths and directories for a test, and removes
exactly those in ``cleanup()``, in reverse order, even when some removals fail (errors are
collected and returned, never hide the rest); nothing it did not create is ever deleted.

Typical use in a pytest fixture::

    jan = Janitor()
    request.addfinalizer(jan.cleanup_or_raise)
    ns = jan.netns()
    br = jan.bridge(addr="10.247.3.1/24")
    host, peer = jan.veth(peer_netns=ns)
"""

from __future__ import annotations

import ipaddress
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from pyroute2 import IPRoute

from tests.support.names import NetTestError, unique_name
from tests.support.netns import Netns, create_netns, delete_link, delete_netns, iproute


class Janitor:
    """Creates namespaces, links and files, and removes exactly those in ``cleanup()``.

    Order of cleanup is the reverse of creation. Removals that find the object already gone are
    fine (a DEL under test may have removed it). Every failure is collected, and cleanup goes on.
    """

    def __init__(self) -> None:
        self._undo: list[tuple[str, Callable[[], object]]] = []

    # -- registering arbitrary undo steps

    def defer(self, what: str, fn: Callable[[], object]) -> None:
        """Run `fn` at cleanup (last deferred runs first)."""
        self._undo.append((what, fn))

    def track_link(self, name: str, netns: Netns | str | None = None) -> None:
        """Delete link `name` at cleanup if it still exists (e.g. a bridge a CNI plugin made)."""
        self.defer(f"link {name}", lambda: delete_link(name, netns))

    def track_path(self, path: str | os.PathLike) -> None:
        """Remove a file or directory tree at cleanup."""
        p = Path(path)

        def rm() -> None:
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=False)
            elif p.exists() or p.is_symlink():
                p.unlink()

        self.defer(f"path {p}", rm)

    # -- making things

    def netns(self, name: str | None = None) -> Netns:
        ns = create_netns(name)
        self.defer(f"netns {ns.name}", lambda: delete_netns(ns))
        return ns

    def bridge(
        self, name: str | None = None, *, addr: str | None = None, up: bool = True, mtu: int | None = None
    ) -> str:
        name = name or unique_name("br")
        with IPRoute() as ipr:
            kw = {"mtu": mtu} if mtu else {}
            ipr.link("add", ifname=name, kind="bridge", **kw)
            self.track_link(name)
            idx = ipr.link_lookup(ifname=name)[0]
            if addr:
                iface = ipaddress.ip_interface(addr)
                ipr.addr("add", index=idx, address=str(iface.ip), prefixlen=iface.network.prefixlen)
            if up:
                ipr.link("set", index=idx, state="up")
        return name

    def veth(
        self,
        host_name: str | None = None,
        peer_name: str | None = None,
        *,
        peer_netns: Netns | None = None,
        master: str | None = None,
        up: bool = True,
        mtu: int | None = None,
    ) -> tuple[str, str]:
        """A veth pair: `host_name` stays on the host, `peer_name` goes to `peer_netns` if given."""
        host_name = host_name or unique_name("vh")
        peer_name = peer_name or unique_name("vp")
        peer: dict = {"ifname": peer_name}
        if peer_netns is not None:
            peer["net_ns_fd"] = peer_netns.name
        with IPRoute() as ipr:
            kw = {"mtu": mtu} if mtu else {}
            ipr.link("add", ifname=host_name, kind="veth", peer=peer, **kw)
            # deleting either end deletes the pair; the host end is the one we can always find
            self.track_link(host_name)
            idx = ipr.link_lookup(ifname=host_name)[0]
            if master:
                ipr.link("set", index=idx, master=ipr.link_lookup(ifname=master)[0])
            if up:
                ipr.link("set", index=idx, state="up")
        if up:
            with iproute(peer_netns) as ipr:
                ipr.link("set", index=ipr.link_lookup(ifname=peer_name)[0], state="up")
        return host_name, peer_name

    def tmpdir(self, base: str | os.PathLike, name: str) -> Path:
        p = Path(base) / name
        p.mkdir(parents=True, exist_ok=False)
        self.track_path(p)
        return p

    # -- undoing

    def cleanup(self) -> list[str]:
        """Undo everything; returns the failures ("what: error"), empty when all went well."""
        errors: list[str] = []
        while self._undo:
            what, fn = self._undo.pop()
            try:
                fn()
            except Exception as exc:  # keep going: the rest must still be removed
                errors.append(f"{what}: {exc!r}")
        return errors

    def cleanup_or_raise(self) -> None:
        errors = self.cleanup()
        if errors:
            raise NetTestError("cleanup failed: " + "; ".join(errors))
