"""Compare expected attachments with what netlink shows, a few namespaces at a time."""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
from collections.abc import Iterable, Sequence

from nri_cni.node import rtnl
from nri_cni.node.model import Difference, Expectation, Finding, FindingKind, HostLink, NetnsView, compare
from nri_cni.node.workers import NetnsGone, NetnsWorkers, socket_in

# decoding is Python under the GIL: more threads than CPUs only contend (measured: 4 workers
# 30% slower than 1 on 2 CPUs); two keep a netns that answers slowly from holding up the round
DEFAULT_WORKERS = 2


def read_netns(netns: str, ifnames: Iterable[str]) -> NetnsView:
    """Links `ifnames` of one netns and their addresses (on a pool worker: it enters the netns
    only to open the socket)."""
    try:
        sock = socket_in(netns, rtnl.open_socket)
    except NetnsGone as exc:
        return NetnsView(netns=netns, gone=True, error=exc.strerror or str(exc))
    except OSError as exc:
        return NetnsView(netns=netns, error=str(exc))
    try:
        return rtnl.read_view(sock, netns, ifnames)
    except OSError as exc:
        return NetnsView(netns=netns, error=f"netlink: {exc}")
    finally:
        sock.close()


def _drain(paths: collections.deque[tuple[str, list[str]]]) -> dict[str, NetnsView]:
    """Reads namespaces from the shared queue until it is empty: one job per worker, so a round
    costs a handful of futures and a slow netns holds up only its own worker."""
    views: dict[str, NetnsView] = {}
    while True:
        try:
            path, ifnames = paths.popleft()
        except IndexError:
            return views
        views[path] = read_netns(path, ifnames)


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

    def __init__(self, *, workers: int = DEFAULT_WORKERS, pool: NetnsWorkers | None = None) -> None:
        self._pool = pool or NetnsWorkers(workers)

    def close(self) -> None:
        self._pool.close()

    async def inspect(self, expectations: Sequence[Expectation]) -> list[Finding]:
        futs, host = self._start(expectations)
        parts = [asyncio.wrap_future(f) for f in futs]
        if host is not None:
            parts.append(asyncio.wrap_future(host))
        done = await asyncio.gather(*parts, return_exceptions=True)
        return self._findings(expectations, done[: len(futs)], done[len(futs)] if host else None)

    def inspect_blocking(self, expectations: Sequence[Expectation]) -> list[Finding]:
        """The same for callers without an event loop (the CLI, benchmarks)."""
        futs, host = self._start(expectations)
        concurrent.futures.wait([*futs, host] if host else futs)
        done = [f.exception() or f.result() for f in futs]
        host_links = (host.exception() or host.result()) if host else None
        return self._findings(expectations, done, host_links)

    def _start(
        self, expectations: Sequence[Expectation]
    ) -> tuple[list[concurrent.futures.Future], concurrent.futures.Future | None]:
        wanted: dict[str, list[str]] = {}
        for e in expectations:
            wanted.setdefault(e.netns, []).append(e.ifname)
        paths = collections.deque(wanted.items())
        names = list(dict.fromkeys(n for e in expectations for n in e.host_ifnames))
        host = self._pool.submit(_host_links, names) if names else None
        jobs = min(self._pool.size, len(paths))
        return [self._pool.submit(_drain, paths) for _ in range(jobs)], host

    @staticmethod
    def _findings(
        expectations: Sequence[Expectation],
        done: Sequence[dict[str, NetnsView] | BaseException],
        host_links: dict[str, HostLink] | BaseException | None,
    ) -> list[Finding]:
        views: dict[str, NetnsView] = {}
        failures = []
        for part in done:
            if isinstance(part, BaseException):
                failures.append(part)  # a stranded worker: the netns it held is reported unreadable
            else:
                views.update(part)
        out = []
        for exp in expectations:
            view = views.get(exp.netns)
            if view is None:
                view = NetnsView(netns=exp.netns, error=f"not read: {failures[0] if failures else 'lost'}")
            if isinstance(host_links, BaseException):
                finding = compare(exp, view, None)
                if exp.host_ifnames:  # the pod's side was read; the host's could not be
                    why = Difference(FindingKind.UNREADABLE, f"cannot read host links: {host_links}")
                    finding = Finding(exp, (*finding.differences, why))
                out.append(finding)
            else:
                out.append(compare(exp, view, host_links))
        return out
