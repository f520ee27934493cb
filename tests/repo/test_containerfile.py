"""The Containerfile of the DaemonSet's image. No base image can be pulled here, so it is
checked as text: its instructions parse, every RUN is valid shell, what it copies exists, and
it provides what the DaemonSet's containers use (paths, commands, the CNI plugins)."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CONTAINERFILE = ROOT / "Containerfile"
DAEMONSET = ROOT / "config" / "kubernetes" / "nri-cni.yaml"
INSTRUCTIONS = {"FROM", "ARG", "RUN", "COPY", "WORKDIR", "ENV", "CMD", "ENTRYPOINT", "LABEL", "USER"}


def instructions() -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    logical = ""
    for line in CONTAINERFILE.read_text().splitlines():
        if not logical and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            logical += line.rstrip()[:-1] + " "
            continue
        logical += line
        word, _, rest = logical.strip().partition(" ")
        out.append((word, rest.strip()))
        logical = ""
    assert not logical, "a continuation line ends the file"
    return out


def stages() -> list[list[tuple[str, str]]]:
    result: list[list[tuple[str, str]]] = []
    for word, rest in instructions():
        if word == "FROM":
            result.append([])
        if result:
            result[-1].append((word, rest))
    return result


def pod_spec() -> dict:
    docs = {d["kind"]: d for d in yaml.safe_load_all(DAEMONSET.read_text()) if d}
    return docs["DaemonSet"]["spec"]["template"]["spec"]


def apt_packages(stage) -> set[str]:
    pkgs: set[str] = set()
    for word, rest in stage:
        if word == "RUN" and "apt-get install" in rest:
            tail = rest.split("apt-get install", 1)[1].split("&&", 1)[0]
            pkgs |= {w for w in tail.split() if not w.startswith("-") and w != "\\"}
    return pkgs


def test_instructions_parse_and_every_run_is_shell():
    found = instructions()
    assert {w for w, _ in found} <= INSTRUCTIONS
    for word, rest in found:
        if word == "RUN":
            check = subprocess.run(["sh", "-n", "-c", rest], capture_output=True, text=True)
            assert check.returncode == 0, (rest, check.stderr)


def test_no_registry_host_in_the_base_image():
    """The base is a short name (the builder's registries resolve it): no host in the repo."""
    args = dict(re.findall(r"^ARG (\w+)=(\S+)$", CONTAINERFILE.read_text(), re.M))
    for word, rest in instructions():
        if word == "FROM":
            image = rest.split()[0]
            image = args.get(image.strip("${}"), image)
            first = image.split("/")[0]
            assert "/" not in image or ("." not in first and ":" not in first), image


def test_what_it_copies_exists():
    for word, rest in instructions():
        if word == "COPY" and not rest.startswith("--from"):
            for src in shlex.split(rest)[:-1]:
                assert (ROOT / src).exists(), src


def test_the_image_has_what_the_daemonset_uses():
    build, final = stages()
    assert {"python3", "python3-venv", "gcc", "libc6-dev"} <= apt_packages(build)
    assert {"python3", "iptables", "nftables", "containernetworking-plugins"} <= apt_packages(final)
    text = CONTAINERFILE.read_text()
    assert "-c requirements/constraints.txt" in text  # the pinned versions CI tests
    spec = pod_spec()
    (init,) = spec["initContainers"]
    env = {e["name"]: e.get("value") for e in init["env"]}
    # the static shim is built where the init container looks for it
    assert f"install-shim --compiled {Path(env['SHIM_PREBUILT']).parent}" in text
    assert env["CNI_PLUGINS"] == "/usr/lib/cni"  # where Debian's containernetworking-plugins are
    assert ("COPY", "--from=build /opt/nri-cni /opt/nri-cni") in final
    (main,) = spec["containers"]
    (cmd,) = [json.loads(rest) for word, rest in final if word == "CMD"]
    assert cmd == main["command"]
    (path,) = [rest for word, rest in final if word == "ENV" and rest.startswith("PATH=")]
    assert path.split("=", 1)[1].split(":")[0] == "/opt/nri-cni/bin"  # `nri-cni` of the venv


@pytest.mark.parametrize("backend", ["nft", "legacy"])
def test_the_iptables_choice_is_valid_shell(backend, tmp_path):
    (_, final) = stages()
    (run,) = [rest for word, rest in final if word == "RUN"]
    branch = "if" + run.split("&& if", 1)[1]
    fake = tmp_path / "update-alternatives"
    fake.write_text('#!/bin/sh\necho alt "$@"\n')
    fake.chmod(0o755)
    out = subprocess.run(
        ["sh", "-c", branch],
        env={"PATH": f"{tmp_path}:/usr/bin:/bin", "IPTABLES": backend},
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    assert ("alt --set iptables /usr/sbin/iptables-legacy" in out.stdout) == (backend == "legacy")
