"""libcni's verbs over a network config list: ADD, CHECK, DEL, FINALIZE, STATUS, GC, VERSION.

Semantics follow libcni/api.go (AddNetworkList, DelNetworkList, CheckNetworkList,
GCNetworkList, GetStatusNetworkList, GetVersionInfo). nri-cni's additions: CNI_ARGS built
from validated pairs with IgnoreUnknown=1, a FINALIZE verb (CNI proposal), and an atomic cache
write. Plugins run through the Executor it is given (cni/executor.py): a wrapper of the real one
sees, delays or fails each call (GC's slots, fault injection).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

from nri_cni.cni import versions
from nri_cni.cni.cache import DEFAULT_CACHE_DIR, CacheEntry, PreparedWrite, ResultCache
from nri_cni.cni.config import (
    NetworkConfigList,
    PluginConf,
    parse_conflist,
    validate_container_id,
    validate_ifname,
    validate_network_name,
)
from nri_cni.cni.executor import Executor
from nri_cni.cni.plugin_env import cni_args, cni_env
from nri_cni.cni.plugin_io import plugin_result, plugin_stdin, version_answer
from nri_cni.cni.prev_result import cached_prev, conf_of, entry_of
from nri_cni.cni.result import Result
from nri_cni.cni.runtime_types import (
    Attachment,
    GCError,
    PluginCall,
    PluginObserver,
    RuntimeConf,
)
from nri_cni.errors import CniCode, CNIError, ConfigError, NriCniError, PluginRef

# re-exported: callers import these from here
__all__ = [
    "Attachment",
    "CNIRuntime",
    "GCError",
    "PluginCall",
    "PluginObserver",
    "RuntimeConf",
    "cni_args",
    "cni_env",
]

log = logging.getLogger(__name__)

_DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class CNIRuntime:
    def __init__(
        self,
        bin_dirs: list[str],
        cache_dir: str = DEFAULT_CACHE_DIR,
        *,
        executor: Executor,
        exec_timeout: float = 60.0,
        durable_cache: bool = False,
        cache: ResultCache | None = None,
        pass_env: Sequence[str] = (),
    ) -> None:
        """executor: how plugins run (PluginExecutor: as processes). pass_env: names of the daemon's environment variables plugins also get.

        durable_cache: ADD returns only once its cache entry is on disk. Off, the entry is
        written atomically before ADD returns and fsync'd right after, off the ADD's path: a
        journal commit waits for every dirty file on that file system (host-local's leases,
        containerd's writes), measured here at 0.5-3 ms, 10% of a bridge chain's ADD."""
        self.bin_dirs = list(bin_dirs)
        self.cache = cache if cache is not None else ResultCache(cache_dir)
        self.durable_cache = durable_cache
        self.exec_timeout = exec_timeout
        self.executor = executor
        # A plugin gets PATH (it execs iptables etc.), the CNI variables and the variables the
        # config names (cni.plugin_env), nothing else of the daemon's environment.
        self.pass_env = tuple(pass_env)
        self._base_env = {"PATH": os.environ.get("PATH") or _DEFAULT_PATH}
        for name in pass_env:
            if name in os.environ:
                self._base_env[name] = os.environ[name]
        self._cni_path = ":".join(self.bin_dirs)

    def with_cache(self, cache: ResultCache) -> CNIRuntime:
        """The same runtime (bin dirs, executor, timeout) keeping its results in `cache`
        (NO_CACHE: nowhere, for an attachment nri-cni does not own)."""
        return self._copy(self.executor, cache)

    def with_executor(self, executor: Executor) -> CNIRuntime:
        """The same runtime (bin dirs, cache, timeout) running its plugins through `executor`
        (usually a wrapper of this one's: GC's slots, fault injection)."""
        return self._copy(executor, self.cache)

    def _copy(self, executor: Executor, cache: ResultCache) -> CNIRuntime:
        return CNIRuntime(
            self.bin_dirs,
            executor=executor,
            exec_timeout=self.exec_timeout,
            durable_cache=self.durable_cache,
            cache=cache,
            pass_env=self.pass_env,
        )

    # ---- verbs -----------------------------------------------------------------------------

    async def add(
        self, net: NetworkConfigList, rt: RuntimeConf, *, observe: PluginObserver | None = None
    ) -> Result:
        """Runs the chain with ADD, each plugin getting the previous result; caches the last.
        `observe` hears of each plugin call that succeeded; a failed one's position in the chain
        travels on its error (CNIError.plugin_index)."""
        validate_container_id(rt.container_id)
        validate_network_name(net.name)
        validate_ifname(rt.ifname)
        if not net.plugins:
            raise ConfigError(f"network {net.name!r} has no plugins", location=net.source)
        env = self._env("ADD", rt)
        paths = self._find_all(net, net.plugins, "ADD")
        last = len(net.plugins) - 1
        prepared = self.cache.prepare(entry_of(net.name, net.bytes, rt))
        result: Result | None = None
        try:
            for i, plugin in enumerate(net.plugins):
                prev = result.to_dict(net.cni_version) if result is not None else None
                if i == last:
                    # runs once the plugin is started: the cache file is made while it works
                    asyncio.get_running_loop().call_soon(prepared.prepare)
                stdin = self._stdin(net, plugin, rt, prev, ask_ips=True)
                out = await self._call(net, plugin, "ADD", env, stdin, paths[i], index=i, observe=observe)
                result = self._parse(net, plugin, "ADD", out, i)
            assert result is not None  # checked above: there was a plugin
            await self.cache_result(net, rt, result, prepared)
        finally:
            prepared.discard()  # after a failure (or an override that did not write): no temp file
        return result

    async def check(
        self,
        net: NetworkConfigList,
        rt: RuntimeConf,
        adjust: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
        *,
        observe: PluginObserver | None = None,
        entry: CacheEntry | None = None,
    ) -> None:
        """CHECK on each plugin in order with the cached result (0.4.0 and later); `adjust`
        may amend that prevResult first (the caller's knowledge of what is not damage);
        `entry`: the cache entry the caller read (not read again, cached_prev)."""
        if not versions.at_least(net.cni_version, "0.4.0"):
            raise CNIError(
                CniCode.INCOMPATIBLE_VERSION,
                f"configuration version {net.cni_version!r} does not support the CHECK command",
                ref=PluginRef(network=net.name, command="CHECK"),
            )
        if net.disable_check:
            return
        env = self._env("CHECK", rt)
        paths = self._find_all(net, net.plugins, "CHECK")
        prev = cached_prev(self.cache, net, rt, "CHECK", entry)
        if prev is not None and adjust is not None:
            prev = adjust(prev)
        for i, plugin in enumerate(net.plugins):
            stdin = self._stdin(net, plugin, rt, prev)
            await self._call(net, plugin, "CHECK", env, stdin, paths[i], index=i, observe=observe)

    async def delete(
        self,
        net: NetworkConfigList,
        rt: RuntimeConf,
        *,
        observe: PluginObserver | None = None,
        entry: CacheEntry | None = None,
    ) -> None:
        """DEL in reverse order with the cached result as prevResult (from 0.4.0 on); a
        missing or corrupt cache entry only costs the prevResult. The entry is removed after.
        `entry`: the cache entry the caller read (not read again, cached_prev)."""
        await self.delete_part(net, rt, self.del_prev(net, rt, entry), observe=observe)
        self.cache.delete(net.name, rt.container_id, rt.ifname)

    def del_prev(
        self, net: NetworkConfigList, rt: RuntimeConf, entry: CacheEntry | None = None
    ) -> dict[str, Any] | None:
        """The prevResult a DEL of the attachment runs with (none below 0.4.0)."""
        return (
            cached_prev(self.cache, net, rt, "DEL", entry)
            if versions.at_least(net.cni_version, "0.4.0")
            else None
        )

    async def delete_part(
        self,
        net: NetworkConfigList,
        rt: RuntimeConf,
        prev: dict[str, Any] | None,
        *,
        observe: PluginObserver | None = None,
    ) -> None:
        """DEL of `net`'s plugins in reverse order with `prev` (del_prev) and nothing else: the
        cache entry stays (a DEL cut around a plugin whose ADD created nothing runs the parts
        of the chain one after another, then removes it: pod/rollback.py)."""
        env = self._env("DEL", rt)
        for i in range(len(net.plugins) - 1, -1, -1):
            plugin = net.plugins[i]
            stdin = self._stdin(net, plugin, rt, prev)
            await self._call(net, plugin, "DEL", env, stdin, index=i, observe=observe)

    async def delete_cached(self, entry: CacheEntry, *, observe: PluginObserver | None = None) -> None:
        """DEL an attachment from its cache entry alone (its network left the config)."""
        net = parse_conflist(entry.config, source=f"cache:{entry.path}")
        if net.name != entry.network_name:
            raise ConfigError(
                f"cached config names network {net.name!r}, entry says {entry.network_name!r}",
                location=entry.path,
            )
        await self.delete(net, conf_of(entry), observe=observe, entry=entry)

    async def finalize(
        self,
        net: NetworkConfigList,
        rt: RuntimeConf,
        prev_result: Result,
        extra: Sequence[PluginConf] = (),
        *,
        observe: PluginObserver | None = None,
    ) -> Result:
        """Runs the list's finalize_plugins, then `extra`, with CNI_COMMAND=FINALIZE.

        Each gets the current result as prevResult; one that prints a result replaces it, one
        that prints nothing leaves it. A changed result is written to the cache, so a later
        DEL sees what FINALIZE made.
        """
        plugins = (*net.finalize_plugins, *extra)
        if not plugins:
            return prev_result
        validate_container_id(rt.container_id)
        validate_ifname(rt.ifname)
        env = self._env("FINALIZE", rt)
        paths = self._find_all(net, plugins, "FINALIZE")
        result, changed = prev_result, False
        for i, plugin in enumerate(plugins):
            out = await self._call(
                net,
                plugin,
                "FINALIZE",
                env,
                self._stdin(net, plugin, rt, result.to_dict(net.cni_version)),
                paths[i],
                index=i,
                observe=observe,
            )
            if out.strip():
                result, changed = self._parse(net, plugin, "FINALIZE", out, i), True
        if changed:
            await self.cache_result(net, rt, result)
        return result

    async def status(self, net: NetworkConfigList) -> None:
        """STATUS on each plugin, stopping at the first error, which is raised as the plugin
        reported it (codes 50/51 intact). Lists below 1.1.0 have no STATUS: ready."""
        if not versions.at_least(net.cni_version, "1.1.0"):
            return
        env = self._env("STATUS", None)
        for plugin in net.plugins:
            await self._call(net, plugin, "STATUS", env, self._stdin(net, plugin, None, None))

    async def gc(self, net: NetworkConfigList, valid: list[Attachment]) -> None:
        """DEL every cached attachment of this network not in `valid` (with its cached
        netns/args but the current config), then GC on each plugin (1.1.0 lists). Every step
        runs; failures are raised together as GCError. The caller keeps ADD/DEL out meanwhile."""
        if net.disable_gc:
            return
        keep = {(a.container_id, a.ifname) for a in valid}
        errors: list[NriCniError] = []
        for entry in self.cache.entries(network=net.name):
            if (entry.container_id, entry.ifname) in keep:
                continue
            try:
                await self.delete(net, conf_of(entry), entry=entry)
            except NriCniError as exc:
                errors.append(exc)
        if versions.at_least(net.cni_version, "1.1.0"):
            attachments = [{"containerID": a.container_id, "ifname": a.ifname} for a in valid]
            # both keys: the spec first named it cni.dev/attachments (containernetworking/cni#1101)
            extra = {"cni.dev/valid-attachments": attachments, "cni.dev/attachments": attachments}
            env = self._env("GC", None)
            for plugin in net.plugins:
                try:
                    await self._call(net, plugin, "GC", env, self._stdin(net, plugin, None, None, extra))
                except NriCniError as exc:
                    errors.append(exc)
        if errors:
            raise GCError(net.name, errors)

    async def version(self, plugin_type: str) -> dict[str, Any]:
        """The plugin's VERSION answer: {"cniVersion", "supportedVersions"}."""
        ref = PluginRef(plugin=plugin_type, command="VERSION")
        # libcni's GetVersionInfo passes these placeholders
        env = cni_env(self._base_env, "VERSION", netns="dummy", ifname="dummy", path="dummy")
        try:
            path = self.executor.find(plugin_type, self.bin_dirs)
            out = await self.executor.exec(
                path, env, json.dumps({"cniVersion": versions.CURRENT}).encode(), self.exec_timeout
            )
        except CNIError as exc:
            if exc.msg == "unknown CNI_COMMAND: VERSION" and not exc.details:  # pre-0.2.0 plugin
                return {"cniVersion": versions.CURRENT, "supportedVersions": ["0.1.0"]}
            exc.ref = ref
            raise
        return version_answer(plugin_type, out, ref)

    # ---- steps -----------------------------------------------------------------------------

    async def cache_result(
        self, net: NetworkConfigList, rt: RuntimeConf, result: Result, prepared: PreparedWrite | None = None
    ) -> None:
        """Writes the attachment's cache entry; a separate step so it can be overridden.
        `prepared`: the same write begun ahead by add() (PreparedWrite)."""
        if prepared is None:
            prepared = self.cache.prepare(entry_of(net.name, net.bytes, rt))
        if self.durable_cache:
            # fsync waits for a journal commit, milliseconds: keep it off the event loop
            await asyncio.to_thread(prepared.commit, result.to_dict(result.cni_version))
            return
        # write+rename of a small file costs less than a thread round trip
        prepared.commit(result.to_dict(result.cni_version), durable=False)
        self.cache.sync_later(net.name, rt.container_id, rt.ifname)

    def network_env(self, command: str) -> dict[str, str]:
        """The environment of a network-wide verb (GC, STATUS, INIT, DEINIT): the container
        variables empty, like libcni; PATH and cni.plugin_env as for every plugin."""
        return self._env(command, None)

    def _env(self, command: str, rt: RuntimeConf | None) -> dict[str, str]:
        """The inherited environment with all six CNI variables set after it (libcni sets
        empty strings for GC and STATUS). CNI_ARGS `IP` asks the IPAM for an address: ADD's
        alone. A DEL or CHECK of an entry an older nri-cni cached with `IP=a,b` would fail in
        host-local for ever (it parses CNI_ARGS on every verb): never passed to them."""
        if rt is None:
            return cni_env(self._base_env, command, path=self._cni_path)
        args = rt.args if command == "ADD" else [(k, v) for k, v in rt.args if k != "IP"]
        return cni_env(
            self._base_env,
            command,
            container_id=rt.container_id,
            netns=rt.netns,
            ifname=rt.ifname,
            args=cni_args(args),
            path=self._cni_path,
        )

    _stdin = staticmethod(plugin_stdin)

    def _find_all(self, net: NetworkConfigList, plugins: Sequence[PluginConf], command: str) -> list[str]:
        """Every binary of a chain that creates things, found before the first one runs: a
        missing second plugin must not leave the first one's interface behind (libcni runs
        the first, then fails; kubernetes#80482). DEL resolves as it goes, to undo what it can."""
        paths = []
        for plugin in plugins:
            try:
                paths.append(self.executor.find(plugin.type, self.bin_dirs))
            except CNIError as exc:
                exc.ref = PluginRef(network=net.name, plugin=plugin.type, command=command)
                raise
        return paths

    async def _call(
        self,
        net: NetworkConfigList,
        plugin: PluginConf,
        command: str,
        env: dict[str, str],
        stdin: bytes,
        path: str | None = None,
        *,
        index: int | None = None,
        observe: PluginObserver | None = None,
    ) -> bytes:
        """One plugin exec'd: `observe` hears of it when it succeeded; when it failed, the
        error names it and its position in the chain (`index`)."""
        try:
            if path is None:
                path = self.executor.find(plugin.type, self.bin_dirs)
            t0 = time.perf_counter()
            out = await self.executor.exec(path, env, stdin, self.exec_timeout)
        except CNIError as exc:
            exc.ref = PluginRef(network=net.name, plugin=plugin.type, command=command)
            exc.plugin_index = index
            raise
        if observe is not None:
            ms = round((time.perf_counter() - t0) * 1000, 2)
            observe.plugin_done(PluginCall(net.name, plugin.type, command, ms))
        return out

    @staticmethod
    def _parse(net: NetworkConfigList, plugin: PluginConf, command: str, out: bytes, index: int) -> Result:
        """The plugin's printed result; an unusable one is its failure (its position kept)."""
        try:
            return plugin_result(net, plugin, command, out)
        except CNIError as exc:
            exc.plugin_index = index
            raise
