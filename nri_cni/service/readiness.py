"""Each network's STATUS (CNI 1.1.0), kept for `status.refuse_when_not_ready`, the shim's
STATUS and `nri-cni status`. A network is not ready when its STATUS fails or its INIT failed
(docs/lifecycle.md)."""

from __future__ import annotations

import logging

from nri_cni.cni.runtime import CNIRuntime
from nri_cni.config import Config, ConfigSource, NetworkSpec
from nri_cni.errors import CniCode, CNIError, NriCniError
from nri_cni.lifecycle import NetworkLifecycle

log = logging.getLogger("nri_cni.daemon")


class NetworkReadiness:
    def __init__(self, cfg: Config | ConfigSource, cni: CNIRuntime, lifecycle: NetworkLifecycle) -> None:
        self.source = ConfigSource.of(cfg)
        self.cni = cni
        self.lifecycle = lifecycle
        self.status: dict[str, str] = {}  # network -> "" (ready) or the STATUS error

    @property
    def cfg(self) -> Config:
        return self.source.current

    def forget_gone(self) -> None:
        """After a reload: the STATUS of networks the config no longer names goes."""
        for name in set(self.status) - {n.name for n in self.cfg.networks}:
            del self.status[name]

    async def refresh(self) -> None:
        for spec in self.cfg.networks:
            await self._status_of(spec)

    async def _status_of(self, spec: NetworkSpec) -> str:
        try:
            await self.cni.status(spec.conflist)
            error = ""
        except NriCniError as exc:
            error = str(exc)
        if error != self.status.get(spec.name):
            if error:
                log.error("network %s is not ready: %s", spec.name, error)
            else:
                log.info("network %s is ready", spec.name)
        self.status[spec.name] = error
        return error

    async def ready(self, network: str) -> str:
        """ "" when the network is ready, else its STATUS error (status.refuse_when_not_ready).
        A network last seen failing is asked again first: a recovered one must not go on
        refusing pods until the next status.interval."""
        if not self.status.get(network):
            return ""
        spec = self.cfg.network(network)
        return await self._status_of(spec) if spec is not None else ""

    def failing(self) -> dict[str, str]:
        """Networks that are not ready -> why: STATUS fails, or INIT failed."""
        return {**{n: e for n, e in self.status.items() if e}, **self.lifecycle.not_ready()}

    def check(self) -> None:
        """Raises the CNI STATUS error (code 50) of the first network that is not ready."""
        failing = {n: e for n, e in self.status.items() if e}
        failing.update(self.lifecycle.not_ready())  # INIT failed: no ADD can succeed
        if failing:
            name, error = next(iter(failing.items()))
            raise CNIError(CniCode.PLUGIN_NOT_AVAILABLE, f"network {name!r} is not ready", details=error)
