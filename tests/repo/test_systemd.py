"""systemd/nri-cni.service and the pre-registered launcher systemd/10-cni."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from nri_cni.config import (
    DEFAULT_CACHE_DIR,
    DEFAULT_CONFIG_PATH,
    DEFAULT_DAEMON_SOCKET,
    DEFAULT_RUNTIME_CACHE_DIR,
    DEFAULT_STATE_DIR,
)

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "systemd" / "nri-cni.service"
LAUNCHER = ROOT / "systemd" / "10-cni"
EXEC_BINARY = "/usr/local/bin/nri-cni"


def parse_unit(text: str) -> dict[tuple[str, str], list[str]]:
    """(section, key) -> every value assigned, in order (keys may repeat)."""
    out: dict[tuple[str, str], list[str]] = {}
    section = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        out.setdefault((section, key.strip()), []).append(value.strip())
    return out


def verify(text: str, tmp_path: Path) -> list[str]:
    """systemd-analyze verify on `text` with ExecStart pointed at an executable that exists
    (verify refuses a missing binary); the lines it printed about this unit."""
    fake = tmp_path / "nri-cni"
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    assert EXEC_BINARY in text
    unit = tmp_path / "nri-cni.service"
    unit.write_text(text.replace(EXEC_BINARY, str(fake)))
    # verify starts a system manager, which needs a /run/systemd it may create: it gets a /run
    # of its own (a user and mount namespace), whoever runs the test and whatever /run holds
    private_run = 'mount -t tmpfs nri-cni-test /run && exec systemd-analyze verify "$0"'
    run = subprocess.run(
        ["unshare", "--map-root-user", "--mount", "sh", "-c", private_run, str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = (run.stdout + run.stderr).splitlines()
    # Units the file pulls in (containerd.service, ...) may have complaints of their own.
    mine = [line for line in lines if "nri-cni.service" in line or str(tmp_path) in line]
    if run.returncode != 0 and not mine:
        mine = lines or [f"systemd-analyze exited {run.returncode}"]
    return mine


def test_unit_verifies_clean(tmp_path):
    assert verify(UNIT.read_text(), tmp_path) == []


@pytest.mark.parametrize(
    "broken",
    [
        ("NoNewPrivileges=yes", "NoNewPrivilegs=yes"),  # unknown key: a warning only, rc 0
        ("Restart=on-failure", "Restart=sometimes"),  # bad value: a warning only, rc 0
        ("[Service]", "[Servic"),  # bad section header: the unit does not load
        ("Type=notify", "Type=notifyy"),
    ],
)
def test_verify_catches_syntax_errors(tmp_path, broken):
    """The check above can fail: the same unit with one mistake is reported."""
    old, new = broken
    text = UNIT.read_text()
    assert old in text
    assert verify(text.replace(old, new, 1), tmp_path) != []


def test_unit_settings():
    unit = parse_unit(UNIT.read_text())
    svc = lambda key: unit.get(("Service", key), [])  # noqa: E731
    assert svc("Type") == ["notify"]
    assert svc("ExecStart") == [f"{EXEC_BINARY} run --config {DEFAULT_CONFIG_PATH}"]
    assert svc("Restart") == ["on-failure"]
    for runtime in ("containerd.service", "crio.service"):
        assert runtime in unit[("Unit", "After")][0].split()
        assert runtime in unit[("Unit", "Wants")][0].split()
    assert ("Unit", "Requires") not in unit and ("Unit", "BindsTo") not in unit
    assert svc("NoNewPrivileges") == ["yes"]
    assert svc("ProtectSystem") == ["strict"]
    assert svc("ProtectHome") == ["yes"]


def test_unit_paths_match_config_defaults():
    unit = parse_unit(UNIT.read_text())
    state = {"/var/lib/" + d for v in unit[("Service", "StateDirectory")] for d in v.split()}
    assert DEFAULT_STATE_DIR in state
    assert DEFAULT_CACHE_DIR in state
    runtime = {"/run/" + d for v in unit[("Service", "RuntimeDirectory")] for d in v.split()}
    assert os.path.dirname(DEFAULT_DAEMON_SOCKET) in runtime
    writable = {p.lstrip("-") for v in unit[("Service", "ReadWritePaths")] for p in v.split()}
    assert DEFAULT_RUNTIME_CACHE_DIR in writable
    assert {"/run/netns", "/var/run/netns"} <= writable


def test_every_capability_is_justified():
    text = UNIT.read_text()
    caps = parse_unit(text)[("Service", "CapabilityBoundingSet")][0].split()
    assert set(caps) == {"CAP_NET_ADMIN", "CAP_NET_RAW", "CAP_SYS_ADMIN"}
    comments = [line for line in text.splitlines() if line.lstrip().startswith("#")]
    for cap in caps:
        assert any(f"#   {cap} " in line for line in comments), f"{cap} has no comment"


def _launch(tmp_path: Path, log: str) -> tuple[list[str], subprocess.CompletedProcess]:
    """Runs systemd/10-cni the way the runtime does: connection on fd 3, only NRI_PLUGIN_*
    in the environment (plus PATH for the fakes and the log choice). A fake nri-cni reports
    its arguments, environment and fd 3, and answers on fd 3."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    report = tmp_path / "report"
    fake = bindir / "nri-cni"
    fake.write_text(
        "#!/bin/sh\n"
        '{ echo "args=$*"; echo "name=$NRI_PLUGIN_NAME idx=$NRI_PLUGIN_IDX sock=$NRI_PLUGIN_SOCKET"\n'
        "  if [ -e /proc/$$/fd/3 ]; then echo fd3=open; fi; } > " + str(report) + "\n"
        "echo pong >&3\n"
        "echo 'a log line' >&2\n"
    )
    fake.chmod(0o755)
    cat = bindir / "systemd-cat"
    cat.write_text(f'#!/bin/sh\necho "$1" > {tmp_path}/cat-args\nshift\nexec "$@"\n')
    cat.chmod(0o755)
    plugin_dir = tmp_path / "plugins"
    plugin_dir.mkdir()
    shutil.copy(LAUNCHER, plugin_dir / "10-cni")
    assert os.access(LAUNCHER, os.X_OK)
    ours, theirs = socket.socketpair()
    with ours, theirs:
        env = {
            "PATH": str(bindir),
            "NRI_PLUGIN_NAME": "cni",
            "NRI_PLUGIN_IDX": "10",
            "NRI_PLUGIN_SOCKET": "3",
            "NRI_CNI_LOG": log,
        }

        def as_fd3() -> None:
            if theirs.fileno() != 3:
                os.dup2(theirs.fileno(), 3)
            os.set_inheritable(3, True)

        run = subprocess.run(
            [str(plugin_dir / "10-cni")],
            env=env,
            preexec_fn=as_fd3,
            close_fds=False,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert run.returncode == 0, run.stderr
        ours.settimeout(5)
        assert ours.recv(16) == b"pong\n"
    return report.read_text().splitlines(), run


def test_launcher_execs_nri_cni_keeping_fd3_and_env(tmp_path):
    log = tmp_path / "nri-cni.log"
    lines, run = _launch(tmp_path, str(log))
    assert lines == [f"args=run --config {DEFAULT_CONFIG_PATH}", "name=cni idx=10 sock=3", "fd3=open"]
    assert log.read_text() == "a log line\n"  # the runtime would have dropped it
    assert run.stderr == ""


def test_launcher_logs_to_the_journal(tmp_path):
    lines, _ = _launch(tmp_path, "journal")
    assert (tmp_path / "cat-args").read_text() == "--identifier=nri-cni\n"
    assert lines == [f"args=run --config {DEFAULT_CONFIG_PATH}", "name=cni idx=10 sock=3", "fd3=open"]
