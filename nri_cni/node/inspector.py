"""Compare expected attachments with what netlink shows, a few namespaces at a time."""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
from collections.abc import Iterable, Sequence
from typing import Any

from nri_cni.node import netlink, rtnl
from nri_cni.node.hostmodel import HostSide
from nri_cni.node.hostside import read_host_side
from nri_cni.node.model import (
    Difference,
    Expectation,
    Finding,
    FindingKind,
    HostLink,
    NetnsView,
    compare,
)
from nri_cni.node.workers import NetnsGone, NetnsWorkers, socket_in

# decoding is Python under the GIL: more threads than CPUs only contend (measured: 4 workers
# 30% slower than 1 on 2 CPUs); two keep a netns that answers slowly from holding up the round
DEFAULT_WORKERS = 2


def read_netns(netns: str, ifnames: Iterable[str], routes: int = 0) -> NetnsView:
    """Links `ifnames` of one netns, their addresses, and its routes (`routes`: 0 none,
    ROUTES_MAIN the main table's through those links, ROUTES_ALL every table) (on a pool worker:
    it enters the netns only to open the socket)."""
    try:
        sock = socket_in(netns, rtnl.open_socket)
    except NetnsGone as exc:
        return NetnsView(netns=netns, gone=True, error=exc.strerror or str(exc))
    except OSError as exc:
        return NetnsView(netns=netns, error=str(exc))
    try:
        return rtnl.read_view(sock, netns, ifnames, routes=bool(routes), all_tables=routes == ROUTES_ALL)
    except OSError as exc:
        return NetnsView(netns=netns, error=f"netlink: {exc}")
    finally:
        sock.close()


ROUTES_MAIN, ROUTES_ALL = 1, 2


def _drain(paths: collections.deque[tuple[str, list[str], int]]) -> dict[str, NetnsView]:
    """Reads namespaces from the shared queue until it is empty: one job per worker, so a round
    costs a handful of futures and a slow netns holds up only its own worker."""
    views: dict[str, NetnsView] = {}
    while True:
        try:
            path, ifnames, routes = paths.popleft()
        except IndexError:
            return views
        views[path] = read_netns(path, ifnames, routes)


def _host_links(names: list[str]) -> dict[str, HostLink]:
    sock = rtnl.open_socket()  # on a worker at home: the daemon's own netns
    try:
        return rtnl.host_links(sock, names)
    finally:
        sock.close()


def _host_links_then_drain(
    names: list[str], paths: collections.deque[tuple[str, list[str], int]]
) -> tuple[dict[str, HostLink] | BaseException, dict[str, NetnsView]]:
    """The host links, then namespaces as `_drain` reads them, in one job: one pod's look (a
    CRI-O CHECK answered from the records) is one hop to a worker and back, not two."""
    try:
        links: dict[str, HostLink] | BaseException = _host_links(names)
    except Exception as exc:  # the netns are read all the same; the host side is reported unreadable
        links = exc
    return links, _drain(paths)


class NodeInspector:
    """`await inspect(expectations)` returns one Finding per expectation, in the same order.

    Each netns is read once however many attachments it holds (eth0, net1...); each host-side
    link the expectations name (a bridge shared by every pod counts once) is read once a round."""

    def __init__(self, pool: NetnsWorkers) -> None:
        self._pool = pool

    @classmethod
    def with_workers(cls, workers: int = DEFAULT_WORKERS) -> NodeInspector:
        """An inspector on a pool of its own (`workers` threads, started on first use)."""
        return cls(NetnsWorkers(workers))

    def close(self) -> None:
        self._pool.close()

    async def inspect(self, expectations: Sequence[Expectation]) -> list[Finding]:
        futs, host, side = self._start(expectations)
        done = await asyncio.gather(
            *map(asyncio.wrap_future, [*futs, *([side] if side else [])]), return_exceptions=True
        )
        return self._findings(expectations, *self._parts(done[: len(futs)], host), done[-1] if side else None)

    def inspect_blocking(self, expectations: Sequence[Expectation]) -> list[Finding]:
        """The same for callers without an event loop (the CLI, benchmarks)."""
        futs, host, side = self._start(expectations)
        concurrent.futures.wait([*futs, *([side] if side else [])])
        done = [f.exception() or f.result() for f in futs]
        host_side = (side.exception() or side.result()) if side else None
        return self._findings(expectations, *self._parts(done, host), host_side)

    async def interface_details(self, netns: str, ifnames: list[str]) -> dict[str, tuple[str, int]]:
        """{ifname: (mac, mtu)} of `netns`'s interfaces that exist (nri_cni/node/netlink.py)."""
        result: dict[str, tuple[str, int]] = await asyncio.wrap_future(
            self._pool.submit(netlink.interface_details, netns, ifnames)
        )
        return result

    @staticmethod
    def _parts(
        done: Sequence[Any], host: bool
    ) -> tuple[list[dict[str, NetnsView] | BaseException], dict[str, HostLink] | BaseException | None]:
        """The jobs' outcomes as the namespaces' views and the host links (`host`: the first
        job read them before its namespaces; a job that failed failed both)."""
        if not host:
            return list(done), None
        first, *rest = done
        if isinstance(first, BaseException):
            return [first, *rest], first
        links, views = first
        return [views, *rest], links

    def _start(
        self, expectations: Sequence[Expectation]
    ) -> tuple[list[concurrent.futures.Future], bool, concurrent.futures.Future | None]:
        wanted: dict[str, list[str]] = {}
        routes: dict[str, int] = {}
        for e in expectations:
            wanted.setdefault(e.netns, []).append(e.ifname)
            if e.routes:
                other = any(r.table not in (None, rtnl.RT_TABLE_MAIN) for r in e.routes)
                routes[e.netns] = max(routes.get(e.netns, 0), ROUTES_ALL if other else ROUTES_MAIN)
        paths = collections.deque((path, ifnames, routes.get(path, 0)) for path, ifnames in wanted.items())
        names = list(dict.fromkeys(n for e in expectations for n in e.host_ifnames))
        # the host's rules (DNAT, masquerade) and leases: once a round for every pod, beside the
        # netns reads
        tables = [p.table for e in expectations for p in e.host_ports]
        tables = list(dict.fromkeys([*tables, *(m.table for e in expectations for m in e.masq)]))
        leases = [lease.path for e in expectations for lease in e.leases]
        side = self._pool.submit(read_host_side, tables, leases) if tables or leases else None
        jobs = [self._pool.submit(_host_links_then_drain, names, paths)] if names else []
        jobs += [
            self._pool.submit(_drain, paths) for _ in range(min(self._pool.size, len(paths)) - len(jobs))
        ]
        return jobs, bool(names), side

    @staticmethod
    def _findings(
        expectations: Sequence[Expectation],
        done: Sequence[dict[str, NetnsView] | BaseException],
        host_links: dict[str, HostLink] | BaseException | None,
        host_side: HostSide | BaseException | None = None,
    ) -> list[Finding]:
        views: dict[str, NetnsView] = {}
        failures = []
        for part in done:
            if isinstance(part, BaseException):
                failures.append(part)  # a stranded worker: the netns it held is reported unreadable
            else:
                views.update(part)
        side = host_side if isinstance(host_side, HostSide) else None
        out = []
        for exp in expectations:
            view = views.get(exp.netns)
            if view is None:
                view = NetnsView(netns=exp.netns, error=f"not read: {failures[0] if failures else 'lost'}")
            links = None if isinstance(host_links, BaseException) else host_links
            finding = compare(exp, view, links, side)
            extra = []
            if isinstance(host_links, BaseException) and exp.host_ifnames:
                # the pod's side was read; the host's could not be
                extra.append(Difference(FindingKind.UNREADABLE, f"cannot read host links: {host_links}"))
            if isinstance(host_side, BaseException) and (exp.host_ports or exp.masq or exp.leases):
                extra.append(
                    Difference(FindingKind.UNREADABLE, f"cannot read host rules and leases: {host_side}")
                )
            if extra and not view.gone and not view.error:
                finding = Finding(exp, (*finding.differences, *extra))
            out.append(finding)
        return out
