"""Running INIT or DEINIT over one network generation: the plugins that declare the verb, in
order (INIT like ADD, DEINIT reversed like DEL), stopping at the first failure.

The environment is the one libcni gives the network-wide verbs (GC, STATUS): every CNI_*
variable set, the container ones empty, CNI_PATH the bin dirs. stdin is the plugin's own config
with the network's name and cniVersion injected, plus two keys nri-cni adds (docs/lifecycle.md):
the generation id, and the other generations of the same network that are live right now, so a
plugin can keep what a sibling generation still uses.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from nri_cni.cni.config import NetworkConfigList, PluginConf
from nri_cni.cni.runtime import CNIRuntime
from nri_cni.errors import CNIError, PluginRef
from nri_cni.lifecycle.spec import plugins_for

GENERATION_KEY = "cni.dev/generation"
OTHER_GENERATIONS_KEY = "cni.dev/other-generations"


@dataclass(frozen=True)
class Sibling:
    """Another live generation of the same network (INIT attempted, DEINIT not finished)."""

    generation: str
    config: bytes


class VerbRunner:
    """Executes the lifecycle verbs with the CNI runtime's executor, bin dirs and timeout."""

    def __init__(self, cni: CNIRuntime) -> None:
        self.cni = cni

    def env(self, verb: str) -> dict[str, str]:
        # the same minimal environment as every plugin call (docs/security.md)
        return self.cni.network_env(verb)

    @staticmethod
    def stdin(net: NetworkConfigList, plugin: PluginConf, generation: str, siblings: list[Sibling]) -> bytes:
        conf = dict(plugin.conf)
        conf["name"] = net.name
        conf["cniVersion"] = net.cni_version
        conf[GENERATION_KEY] = generation
        conf[OTHER_GENERATIONS_KEY] = [
            {"generation": s.generation, "config": json.loads(s.config)} for s in siblings
        ]
        return json.dumps(conf, separators=(",", ":")).encode()

    async def run(self, verb: str, net: NetworkConfigList, generation: str, siblings: list[Sibling]) -> int:
        """Runs `verb` on every plugin that declares it; returns how many ran. Raises the first
        failure as a CNIError naming the network, the plugin and the verb."""
        plugins = plugins_for(net, verb)
        env = self.env(verb)
        for _, plugin in plugins:
            ref = PluginRef(network=net.name, plugin=plugin.type, command=verb)
            try:
                path = self.cni.executor.find(plugin.type, self.cni.bin_dirs)
                # a plugin's success output means nothing for these verbs: it is ignored
                await self.cni.executor.exec(
                    path, env, self.stdin(net, plugin, generation, siblings), self.cni.exec_timeout
                )
            except CNIError as exc:
                exc.ref = ref
                raise
        return len(plugins)
