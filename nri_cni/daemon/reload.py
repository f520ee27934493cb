"""Hot reload: nri-cni re-reads its config file and the CNI files it points at when they change.

Triggers: inotify on the directories of those files (DirWatcher), a periodic rescan (the
fallback: inotify misses changes on some filesystems, and directories that do not exist yet
cannot be watched), and SIGHUP. A trigger only starts a read; the reload is applied when the
result differs from the running configuration. What is applied is all or nothing:

- a file that does not parse or validate refuses the whole change, logged with its location;
  the running configuration stays;
- a change to a setting only a restart can apply (sockets, directories, mode, plugin identity,
  timers) is refused the same way, naming the setting;
- otherwise the new configuration replaces the old one at once: the next ADD uses it, every
  attachment keeps the config it was made with (DEL reads the cache), and the network lifecycle
  INITs new generations and DEINITs the ones that left (docs/lifecycle.md).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from nri_cni.cni.config import FINALIZE_DROPIN_DIR, PluginConf, finalize_dir_plugins
from nri_cni.config import Config, ConfigErrors, load_config
from nri_cni.daemon.inotify import DirWatcher, InotifyUnavailable
from nri_cni.errors import ConfigError

log = logging.getLogger("nri_cni.reload")

# Settings read once at start-up (sockets bound, directories opened, timers started, limits
# sized, the identity the runtime registered): a change to one of them needs a restart. The
# same keys, in this order, are listed in docs/lifecycle.md ("Restart-only settings"); every
# other setting is read from the running config each time it is used.
RESTART_ONLY: tuple[tuple[str, Callable[[Config], object]], ...] = (
    ("mode", lambda c: c.mode),
    ("nri.*", lambda c: c.nri),
    ("daemon.socket", lambda c: c.daemon_socket),
    ("daemon.allowed_gids", lambda c: c.local.allowed_gids),
    ("state_dir", lambda c: c.state_dir),
    ("log.format", lambda c: c.log_format),
    ("cni.bin_dirs", lambda c: c.cni.bin_dirs),
    ("cni.cache_dir", lambda c: c.cni.cache_dir),
    ("cni.plugin_timeout", lambda c: c.cni.plugin_timeout),
    ("cni.plugin_env", lambda c: c.cni.plugin_env),
    ("cni.runtime_cache_dir", lambda c: c.cni.runtime_cache_dir),
    ("files.trust", lambda c: c.trust_files),
    ("gc.interval", lambda c: c.gc_interval),
    ("status.interval", lambda c: c.status_interval),
    ("verify.interval", lambda c: c.verify_interval),
    ("repair", lambda c: c.repair),
    ("limits.parallel_per_node", lambda c: c.limits.parallel_per_node),
    ("metrics.listen", lambda c: c.metrics_listen),
    ("metrics.max_connections", lambda c: c.metrics_server.max_connections),
    ("metrics.timeout", lambda c: c.metrics_server.timeout),
    ("lifecycle.*", lambda c: c.lifecycle),
    ("reload.*", lambda c: c.reload),
)


@dataclass
class ReloadState:
    applied: int = 0
    last_applied: float = 0.0
    refused: str = ""  # the error of the last refused change, "" once a change is applied
    refused_at: float = 0.0


def watched_dirs(cfg: Config) -> set[str]:
    """The directories whose changes can change `cfg`: the config file's, each network file's
    and its drop-in dir `<dir>/<network>/`, and the finalize drop-ins with their conf dir."""
    dirs: set[str] = set()
    if cfg.path and os.path.isabs(cfg.path):
        dirs.add(os.path.dirname(cfg.path))
    for spec in cfg.networks:
        source = spec.conflist.source
        if source and os.path.isabs(source):
            conf_dir = os.path.dirname(source)
            dirs.update((conf_dir, os.path.join(conf_dir, spec.conflist.name)))
    if cfg.nad_dir:  # NetworkAttachmentDefinitions (nri_cni/config/nad.py): a new file is a new network
        dirs.add(cfg.nad_dir)
    finalize = cfg.cni.finalize_dir.rstrip("/")
    if os.path.basename(finalize) == FINALIZE_DROPIN_DIR:
        dirs.update((finalize, os.path.dirname(finalize)))
    return dirs


class ConfigReloader:
    def __init__(
        self,
        cfg: Config,
        apply: Callable[[Config], Awaitable[None]],
        *,
        loader: Callable[[str], Config] = load_config,
    ) -> None:
        self.cfg = cfg
        self._apply = apply
        self._loader = loader
        self.state = ReloadState()
        self._dropins, _ = finalize_dir_plugins(cfg.cni.finalize_dir, trust=cfg.trust_files)
        self._trigger = asyncio.Event()
        self._lock = asyncio.Lock()
        self._watcher: DirWatcher | None = None
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def enabled(self) -> bool:
        # the embedded default and a test's in-memory config have no file to watch
        return bool(self.cfg.path) and os.path.isfile(self.cfg.path)

    async def start(self) -> None:
        if not self.enabled:
            log.info("hot reload is off: %r is not a file", self.cfg.path)
            return
        settings = self.cfg.reload
        if settings.watch:
            try:
                self._watcher = DirWatcher(self.trigger)
                self._watcher.watch(watched_dirs(self.cfg))
            except InotifyUnavailable as exc:
                log.warning("no inotify (%s): config changes are seen by the rescan only", exc)
        self._tasks.append(asyncio.create_task(self._on_trigger(), name="reload-trigger"))
        if settings.rescan_interval > 0:
            self._tasks.append(
                asyncio.create_task(self._rescan(settings.rescan_interval), name="reload-rescan")
            )

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        if self._watcher is not None:
            self._watcher.close()
            self._watcher = None

    def trigger(self) -> None:
        """Something may have changed (inotify, SIGHUP): read again after the debounce."""
        self._trigger.set()

    async def _on_trigger(self) -> None:
        while True:
            await self._trigger.wait()
            await asyncio.sleep(self.cfg.reload.debounce)  # let an editor finish its writes
            self._trigger.clear()
            await _survive(self.reload_now("a file changed"))

    async def _rescan(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            await _survive(self.reload_now("periodic rescan"))

    async def reload_now(self, reason: str) -> bool:
        """Reads the configuration again; True if a change was applied."""
        async with self._lock:
            self._rewatch()  # first: a change made while we read is then seen again
            try:
                new, dropins = await asyncio.to_thread(self._read)
                if new == self.cfg and dropins == self._dropins:
                    self._back_to_running(reason)  # the refused change was undone
                    return False
                self._check_restart_only(new)
            except ConfigError as exc:
                self._refused(exc, reason)
                return False
            except Exception as exc:  # no input may stop hot reload
                self._refused(ConfigError(f"cannot read the configuration: {exc!r}"[:500]), reason)
                return False
            old = self.cfg
            await self._apply(new)
            self.cfg, self._dropins = new, dropins
            self.state.applied += 1
            self.state.last_applied = time.time()
            self.state.refused = ""
            log.info("configuration reloaded (%s): %s", reason, describe_change(old, new))
            if self._rewatch():
                self.trigger()  # directories the new config added may have changed meanwhile
            return True

    def _read(self) -> tuple[Config, tuple[PluginConf, ...]]:
        new = self._loader(self.cfg.path)
        dropins, errors = finalize_dir_plugins(new.cni.finalize_dir, trust=new.trust_files)
        if errors:
            raise ConfigErrors(errors)
        return new, dropins

    def _check_restart_only(self, new: Config) -> None:
        changed = [key for key, get in RESTART_ONLY if get(new) != get(self.cfg)]
        if changed:
            raise ConfigError(
                f"changing {', '.join(changed)} needs a restart of nri-cni",
                location=f"{self.cfg.path}: {changed[0]}",
            )

    def _refused(self, exc: ConfigError, reason: str) -> None:
        text = str(exc)
        if text != self.state.refused:  # the rescan finds the same error again and again
            # one line (a collector keeps time and level with it); the errors joined by " | "
            flat = " | ".join(line.strip() for line in text.splitlines() if line.strip())
            log.error("configuration change refused (%s); the running configuration stays: %s", reason, flat)
        self.state.refused = text
        self.state.refused_at = time.time()

    def _back_to_running(self, reason: str) -> None:
        """The files say what runs again (the bad change was fixed or reverted): nothing to
        apply, and the refusal no longer holds."""
        if self.state.refused:
            log.info(
                "configuration files match the running configuration again (%s): refusal cleared", reason
            )
            self.state.refused = ""

    def _rewatch(self) -> set[str]:
        """Watches the running config's directories (retrying those missing so far)."""
        if self._watcher is None:
            return set()
        return self._watcher.watch(watched_dirs(self.cfg))

    def report(self) -> dict[str, Any]:
        return {
            "enabled": self.enabled,
            "inotify": self._watcher is not None,
            "applied": self.state.applied,
            "lastApplied": self.state.last_applied,
            "refused": self.state.refused,
            "refusedAt": self.state.refused_at,
        }


async def _survive(reload) -> None:
    # a long-running task outlives whatever one reload meets; the next change is read again
    try:
        await reload
    except Exception:
        log.exception("configuration reload failed; the running configuration stays")


def describe_change(old: Config, new: Config) -> str:
    before = {n.name: n.conflist.bytes for n in old.networks}
    after = {n.name: n.conflist.bytes for n in new.networks}
    parts = [f"+{n}" for n in after if n not in before]
    parts += [f"-{n}" for n in before if n not in after]
    parts += [f"~{n}" for n in after if n in before and before[n] != after[n]]
    return (
        "networks "
        + (" ".join(parts) if parts else "unchanged")
        + (
            ""
            if (old.primary_network, old.failure_policy, old.log_level)
            == (new.primary_network, new.failure_policy, new.log_level)
            else ", settings changed"
        )
    )
