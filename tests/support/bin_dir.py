"""A test's CNI bin dir: the real plugins (from Debian sid, extracted under
$NRI_CNI_DEPS/root/usr/lib/cni by .ci/install-deps) linked in, and plugins of the tests' own
installed under a name of the test's choice."""

from __future__ import annotations

import os
import sys
from pathlib import Path

DEPS = Path(os.environ.get("NRI_CNI_DEPS", "/opt/nri-cni-deps"))
REAL_PLUGINS = DEPS / "root" / "usr" / "lib" / "cni"
PLUGINS = Path(__file__).resolve().parents[1] / "plugins"


def install_plugin(bin_dir: Path, name: str, script: str) -> Path:
    """Writes `script` (with its #! line) into `bin_dir` as the executable `name`; its path."""
    target = bin_dir / name
    target.write_text(script)
    target.chmod(0o755)
    return target


def python_script(source: str) -> str:
    """`source` run by this interpreter in isolated mode (standard library only)."""
    return f"#!{os.path.realpath(sys.executable)} -IS\n" + source


def install_test_plugin(bin_dir: Path, plugin: str, *names: str) -> None:
    """tests/plugins/<plugin>.py installed under each of `names`."""
    script = python_script((PLUGINS / f"{plugin}.py").read_text())
    for name in names:
        install_plugin(bin_dir, name, script)


def link_real_plugins(bin_dir: Path) -> None:
    """A symlink in `bin_dir` to every real plugin."""
    if not (REAL_PLUGINS / "bridge").exists():
        raise RuntimeError(f"real CNI plugins missing at {REAL_PLUGINS}: run .ci/install-deps")
    for plugin in REAL_PLUGINS.iterdir():
        (bin_dir / plugin.name).symlink_to(plugin)
