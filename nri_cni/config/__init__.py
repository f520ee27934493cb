"""nri-cni's own configuration: the node admin's YAML file.

Parsed into frozen dataclasses and validated as a whole; every problem is reported with where it
is (file and key path, e.g. `config.yaml: networks[1].file`) and why, so that `nri-cni
check-config` and a refused hot reload can say exactly what to fix. The CNI network lists the
config points at are loaded here too (inline, from a file, or by name from a conf dir), so a config
that validates is one the daemon can run.

The package: model.py holds the values, reader.py walks the YAML, parse.py validates and loads.
"""

from nri_cni.config.model import (
    DEFAULT_BIN_DIRS,
    DEFAULT_CACHE_DIR,
    DEFAULT_CONFIG_PATH,
    DEFAULT_DAEMON_SOCKET,
    DEFAULT_FINALIZE_DIR,
    DEFAULT_NRI_SOCKET,
    DEFAULT_RUNTIME_CACHE_DIR,
    DEFAULT_STATE_DIR,
    FAILURE_POLICIES,
    MODES,
    CniSettings,
    Config,
    ContainerSettings,
    LifecycleSettings,
    LocalSocketSettings,
    MetricsServerSettings,
    NetworkContainers,
    NetworkSpec,
    NriSettings,
    PodLimits,
    ReloadSettings,
)
from nri_cni.config.parse import (
    ConfigErrors,
    load_config,
    load_config_text,
    parse_config,
)
from nri_cni.config.source import ConfigSource

__all__ = [
    "CniSettings",
    "Config",
    "ConfigErrors",
    "ConfigSource",
    "ContainerSettings",
    "DEFAULT_BIN_DIRS",
    "DEFAULT_CACHE_DIR",
    "DEFAULT_CONFIG_PATH",
    "DEFAULT_DAEMON_SOCKET",
    "DEFAULT_FINALIZE_DIR",
    "DEFAULT_NRI_SOCKET",
    "DEFAULT_RUNTIME_CACHE_DIR",
    "DEFAULT_STATE_DIR",
    "FAILURE_POLICIES",
    "LifecycleSettings",
    "LocalSocketSettings",
    "MODES",
    "MetricsServerSettings",
    "NetworkContainers",
    "NetworkSpec",
    "NriSettings",
    "PodLimits",
    "ReloadSettings",
    "load_config",
    "load_config_text",
    "parse_config",
]
