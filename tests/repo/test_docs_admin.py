"""What the docs tell an admin stays true: the things that were missing or wrong."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import yaml

from nri_cni.pod.select import MAX_ANNOTATION_BYTES, MAX_REQUESTED_NETWORKS
from tests.support.reloading import base_config, inline, start, write

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
DEPLOY = (ROOT / "docs" / "deploy.md").read_text()
TROUBLE = (ROOT / "docs" / "troubleshooting.md").read_text()
SOURCE = "\n".join(p.read_text() for p in (ROOT / "nri_cni").rglob("*.py"))


def section(text: str, number: int) -> str:
    return re.split(r"^## ", text.split(f"\n## {number}. ", 1)[1], maxsplit=1, flags=re.M)[0]


def test_finalize_dir_naming_and_state_dir_are_documented():
    for doc in (README, DEPLOY):
        assert "`_finalize.d`" in doc and "state_dir" in doc
    assert "must name a directory called `_finalize.d`" in DEPLOY
    assert "must be named `_finalize.d`" in README


def test_the_annotation_limits_are_documented_as_enforced():
    assert MAX_ANNOTATION_BYTES == 64 * 1024 and MAX_REQUESTED_NETWORKS == 32
    assert "64 KiB and 32 networks" in README
    six = section(TROUBLE, 6)
    assert "64 KiB" in six and f"is larger than {MAX_ANNOTATION_BYTES} bytes" in six


def test_section_6_says_a_namespaces_change_applies_live(tmp_path):
    six = section(TROUBLE, 6)
    assert "restart" not in six.replace("without a restart", "")
    assert "applies at once, without a restart" in six
    # and it does: the reloader applies a namespaces change, no restart-only setting refuses it
    path = tmp_path / "config.yaml"
    lan = inline("lan")
    cfg = base_config(tmp_path, [inline("pods", default=True), {**lan, "namespaces": ["default"]}])
    path.write_text(yaml.safe_dump(cfg))

    async def scenario():
        reloader, applied = start(path)
        await reloader.start()
        cfg["networks"][1]["namespaces"] = ["default", "kube-system"]
        write(path, yaml.safe_dump(cfg))
        new = await applied.next()
        await reloader.close()
        return new, reloader.report()["refused"]

    new, refused = asyncio.run(scenario())
    assert new.network("lan").allowed_in("kube-system") and refused == ""


def test_quoted_messages_are_the_codes():
    for fragment in (
        "configuration change refused (",
        "the running configuration stays: ",
        "refusal cleared",
        "no value for ",
        "is not a Kubernetes object name",
        "spec.config is empty",
    ):
        assert fragment in SOURCE, fragment
    assert "refusal cleared" in TROUBLE and "no value for ${node.podSubnet} on node" in TROUBLE


def test_status_exit_codes_are_documented_alike():
    assert "exit 0 ready, 1 degraded, 2 not ready or unreachable" in README
    assert "exits 0 (ready) or 1 (degraded" in DEPLOY and "status --ping" in DEPLOY


def readme_commands() -> list[str]:
    block = README.split("```sh", 1)[1].split("```", 1)[0]
    return [line.split("#", 1)[0].strip() for line in block.strip().splitlines()]


def test_readme_commands_need_no_sudo():
    """A root shell on a node often has no sudo: the two commands run as they are written."""
    assert readme_commands() == ["bash config/local/up.sh", "bash .ci/run"]
    assert "sudo " not in README
