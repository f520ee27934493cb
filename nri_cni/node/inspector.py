"""Compare expected attachments with what netlink shows, a few namespaces at a time."""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
from collections.abc import Iterable, Sequence

from nri_cni.node import rtnl
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
        parts = [asyncio.wrap_future(f) for f in futs]
        extra = [f for f in (host, side) if f is not None]
        done = await asyncio.gather(*parts, *map(asyncio.wrap_future, extra), return_exceptions=True)
        rest = iter(done[len(futs) :])
        host_links = next(rest) if host is not None else None
        host_side = next(rest) if side is not None else None
        return self._findings(expectations, done[: len(futs)], host_links, host_side)

    def inspect_blocking(self, expectations: Sequence[Expectation]) -> list[Finding]:
        """The same for callers without an event loop (the CLI, benchmarks)."""
        futs, host, side = self._start(expectations)
        concurrent.futures.wait([*futs, *(f for f in (host, side) if f is not None)])
        done = [f.exception() or f.result() for f in futs]
        host_links = (host.exception() or host.result()) if host else None
        host_side = (side.exception() or side.result()) if side else None
        return self._findings(expectations, done, host_links, host_side)

    def _start(
        self, expectations: Sequence[Expectation]
    ) -> tuple[
        list[concurrent.futures.Future], concurrent.futures.Future | None, concurrent.futures.Future | None
    ]:
        wanted: dict[str, list[str]] = {}
        routes: dict[str, int] = {}
        for e in expectations:
            wanted.setdefault(e.netns, []).append(e.ifname)
            if e.routes:
                other = any(r.table not in (None, rtnl.RT_TABLE_MAIN) for r in e.routes)
                routes[e.netns] = max(routes.get(e.netns, 0), ROUTES_ALL if other else ROUTES_MAIN)
        paths = collections.deque((path, ifnames, routes.get(path, 0)) for path, ifnames in wanted.items())
        names = list(dict.fromkeys(n for e in expectations for n in e.host_ifnames))
        host = self._pool.submit(_host_links, names) if names else None
        # the host's rules (DNAT, masquerade) and leases: once a round for every pod, beside the
        # netns reads
        tables = [p.table for e in expectations for p in e.host_ports]
        tables = list(dict.fromkeys([*tables, *(m.table for e in expectations for m in e.masq)]))
        leases = [lease.path for e in expectations for lease in e.leases]
        side = self._pool.submit(read_host_side, tables, leases) if tables or leases else None
        jobs = min(self._pool.size, len(paths))
        return [self._pool.submit(_drain, paths) for _ in range(jobs)], host, side

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
