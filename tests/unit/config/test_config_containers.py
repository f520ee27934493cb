"""The `containers:` section and `networks[].containers` (nri_cni/config/containers.py): defaults,
values, and located errors like the other keys."""

from __future__ import annotations

import pytest

from nri_cni.config import ContainerSettings, NetworkContainers, load_config_text
from nri_cni.errors import ConfigError

NET = "networks: [{name: podnet, default: true, conflist: {cniVersion: 1.1.0, name: podnet, plugins: [{type: bridge}]}%s}]\n"


def test_defaults_annotation_and_file_on_sockets_with_no_allowed_dir():
    cfg = load_config_text(NET % "", "/x/config.yaml")
    assert cfg.containers == ContainerSettings(annotations=True, file=True, sockets=True, socket_dirs=())
    assert cfg.networks[0].containers == NetworkContainers()


def test_values_globally_and_per_network():
    text = (
        "containers: {annotations: false, socket_dirs: [/run/vhost/]}\n"
        + NET % ", containers: {file: false, sockets: false}"
    )
    cfg = load_config_text(text, "/x/config.yaml")
    assert cfg.containers == ContainerSettings(
        annotations=False, file=True, sockets=True, socket_dirs=("/run/vhost",)
    )
    assert cfg.networks[0].containers == NetworkContainers(annotations=True, file=False, sockets=False)


@pytest.mark.parametrize(
    ("section", "network", "where", "says"),
    [
        ("containers: {files: true}", "", "/x/config.yaml: containers.files", "unknown key"),
        ("containers: {file: yes please}", "", "/x/config.yaml: containers.file", "true or false"),
        (
            "containers: {socket_dirs: [run/vhost]}",
            "",
            "/x/config.yaml: containers.socket_dirs[0]",
            "absolute",
        ),
        (
            "containers: {socket_dirs: [/]}",
            "",
            "/x/config.yaml: containers.socket_dirs[0]",
            "any socket path",
        ),
        ("containers: {socket_dirs: [/run/../etc]}", "", "/x/config.yaml: containers.socket_dirs[0]", "'..'"),
        ("containers: [file]", "", "/x/config.yaml: containers", "mapping"),
        ("", ", containers: {sockets: 1}", "/x/config.yaml: networks[0].containers.sockets", "true or false"),
        ("", ", containers: {mounts: true}", "/x/config.yaml: networks[0].containers.mounts", "unknown key"),
    ],
)
def test_located_errors(section, network, where, says):
    with pytest.raises(ConfigError) as err:
        load_config_text(section + "\n" + NET % network, "/x/config.yaml")
    assert where in str(err.value) and says in str(err.value)


def test_control_the_same_keys_well_formed_pass():
    text = "containers: {file: true, socket_dirs: [/run/vhost]}\n" + NET % ", containers: {sockets: true}"
    assert load_config_text(text, "/x/config.yaml").containers.socket_dirs == ("/run/vhost",)
