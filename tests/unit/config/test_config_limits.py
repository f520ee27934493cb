"""Deep and exploding documents in the config files are refused, by the loader and by
`nri-cni check-config`, with an error that names the limit and without expanding them; on any
text the config loader raises only ConfigError. (On a running daemon:
tests/integration/local/test_deep_documents_refused.py.)"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nri_cni.config import load_config_text
from nri_cni.errors import ConfigError
from tests.support.secharness import BOMB


def test_check_config_refuses_an_alias_bomb_without_expanding_it():
    with pytest.raises(ConfigError) as err:
        load_config_text(BOMB, "/x/config.yaml")
    assert "aliases" in str(err.value)
    with pytest.raises(ConfigError) as err:
        load_config_text("a: " + "[" * 100_000, "/x/config.yaml")
    assert "nested deeper" in str(err.value)


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    text=st.one_of(
        st.text(max_size=300),
        st.integers(0, 20_000).map(lambda n: "a: " + "[" * n),
        st.integers(0, 3_000).map(lambda n: "- " * n + "x"),
        st.just(BOMB),
    )
)
def test_config_loader_raises_only_config_errors_on_any_text(text):
    try:
        load_config_text(text, "/x/config.yaml")
    except ConfigError:
        pass


def test_check_config_refuses_an_alias_bomb_as_a_command(tmp_path):
    """`nri-cni check-config` on the 600-byte alias bomb: a located error, exit 2, at once."""
    import resource
    import subprocess
    import sys

    path = tmp_path / "config.yaml"
    # the bomb inside an inline conflist, whose JSON text the old loader built: 9**9 strings
    anchors = "".join("    " + line + "\n" for line in BOMB.splitlines())
    path.write_text(
        "networks:\n- name: podnet\n  default: true\n  conflist:\n"
        + anchors
        + "    cniVersion: 1.1.0\n    name: podnet\n    plugins: [{type: bridge, x: *i}]\n"
    )

    def limit_memory():  # the old loader needed gigabytes here
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    proc = subprocess.run(
        [sys.executable, "-m", "nri_cni.cli", "check-config", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=limit_memory,
    )
    assert proc.returncode == 2, proc.stderr
    assert "aliases" in proc.stderr and f"{path}:6:" in proc.stderr, proc.stderr
