"""The modes, each built once from the config: the questions each answers (who owns eth0, the
primary network, where the runtime's primary result is read in secondary mode), and no mode name
compared anywhere but in the modes and config parsing."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from nri_cni.cni.cache import CacheEntry, ResultCache
from nri_cni.config import NetworkSpec
from nri_cni.pod.model import PodInfo, PrimaryNetwork
from nri_cni.pod.select import Selected
from nri_cni.service.modes import NativeMode, RuntimeIps, SecondaryMode, ShimMode, mode_for
from nri_cni.service.podcheck import PodCheck, pod_check
from nri_cni.service.roster import PodRecord
from tests.support.configdocs import mode_config

ROOT = Path(__file__).resolve().parents[3]


def test_each_mode_answers_the_questions_once(tmp_path):
    shim = mode_for(mode_config(tmp_path, "shim"))
    native = mode_for(mode_config(tmp_path, "native", primary_network="podnet"))
    secondary = mode_for(mode_config(tmp_path, "secondary", primary_network="cbr0"))
    assert (
        isinstance(shim, ShimMode) and isinstance(native, NativeMode) and isinstance(secondary, SecondaryMode)
    )
    flags = [
        (
            m.attaches_on_run,
            m.answers_run_pod,
            m.primary.ours,
        )
        for m in (shim, native, secondary)
    ]
    assert flags == [
        (False, False, True),
        (True, True, True),
        (True, False, False),
    ]
    assert native.primary == PrimaryNetwork("podnet", ours=True)
    assert shim.runtime_primary is None and native.runtime_primary is None


def test_secondary_mode_reads_the_runtime_primary_from_the_runtimes_cache(tmp_path):
    mode = mode_for(mode_config(tmp_path, "secondary", primary_network="cbr0"))
    pod = PodInfo("p" * 64, netns="/run/netns/x")
    primary = mode.runtime_primary
    assert primary is not None and primary.network == "cbr0"
    assert primary.entry(pod.id) is None  # nothing cached yet: FINALIZE skips it
    ResultCache(str(tmp_path / "runtime")).write(
        CacheEntry(
            container_id=pod.id,
            ifname="eth0",
            network_name="cbr0",
            config=b"{}",
            result={"cniVersion": "1.1.0"},
        )
    )
    found = primary.entry(pod.id)  # read when asked: the entry the runtime cached since
    assert found is not None and found.container_id == pod.id
    assert primary.entry("q" * 64) is None  # control: another pod's entry is not there


MODE_NAMES = {"shim", "native", "secondary"}


def test_no_mode_name_is_compared_outside_the_modes_and_config_parsing():
    allowed = {
        ROOT / "nri_cni" / "service" / "modes.py",
        ROOT / "nri_cni" / "config" / "parse.py",
        ROOT / "nri_cni" / "config" / "model.py",
    }
    found = []
    for path in sorted((ROOT / "nri_cni").rglob("*.py")):
        if path in allowed or "api" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                parts = [node.left, *node.comparators]
                consts = [p for p in parts if isinstance(p, ast.Constant) and p.value in MODE_NAMES]
                consts += [
                    e
                    for p in parts
                    if isinstance(p, (ast.Tuple, ast.List, ast.Set))
                    for e in p.elts
                    if isinstance(e, ast.Constant) and e.value in MODE_NAMES
                ]
                if consts:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == []


# -- what each mode makes of the runtime's IPs (Mode.runtime_ips), one row per answer beside its
# control: the same pod with the one thing changed that must flip it

POD = "f9" * 32
OURS = "10.99.0.2"
SHIM = ShimMode(PrimaryNetwork("podnet", ours=True))
NATIVE = NativeMode(PrimaryNetwork("podnet", ours=True))
SECONDARY = SecondaryMode(PrimaryNetwork("cbr0", ours=False), ResultCache("/nonexistent"))


def _reading(runtime_ips: tuple[str, ...], *, attached: bool = True) -> PodCheck:
    result = {"cniVersion": "1.1.0", "ips": [{"address": f"{OURS}/24", "interface": 0}]}
    entries = [CacheEntry(POD, "eth0", "podnet", b"{}", netns="/n", result=result)] if attached else []
    pod = PodInfo(POD, name="f9", namespace="default", netns="/n", ips=runtime_ips)
    return pod_check(pod, entries, [Selected(NetworkSpec(name="podnet", conflist=None), "eth0")])


def _record(ips_lost: bool = False) -> PodRecord:
    return PodRecord(POD, pod=PodInfo(POD, netns="/n"), ips_lost=ips_lost)


@pytest.mark.parametrize(
    ("mode", "reading", "record", "answer"),
    [
        (SHIM, _reading((OURS,)), _record(), RuntimeIps(("podnet", "eth0"), primary_ips=(OURS,))),
        (
            SHIM,
            _reading(("10.99.0.9",)),
            _record(),
            RuntimeIps(
                ("podnet", "eth0"),
                "the runtime reports 10.99.0.9; eth0 has 10.99.0.2",
                primary_ips=("10.99.0.9",),
            ),
        ),
        (
            SHIM,
            _reading((), attached=False),
            _record(),
            RuntimeIps(("podnet", "eth0"), nothing_to_make_true=True),
        ),
        (
            SHIM,
            _reading((OURS,), attached=False),
            _record(),
            RuntimeIps(("podnet", "eth0"), primary_ips=(OURS,)),
        ),
        (NATIVE, _reading((OURS,)), _record(), RuntimeIps(("podnet", "eth0"))),
        (
            NATIVE,
            _reading(()),
            _record(),
            RuntimeIps(
                ("podnet", "eth0"), "the runtime reports no IP; nri-cni gave it 10.99.0.2", missed=True
            ),
        ),
        (
            NATIVE,
            _reading((OURS,), attached=False),
            _record(),
            RuntimeIps(("podnet", "eth0"), missed=True, readd={("podnet", "eth0"): (OURS,)}),
        ),
        (NATIVE, _reading((), attached=False), _record(), RuntimeIps(("podnet", "eth0"), missed=True)),
        (SECONDARY, _reading(()), _record(ips_lost=False), RuntimeIps(None)),
        (SECONDARY, _reading(("10.99.0.9",)), _record(ips_lost=True), RuntimeIps(None)),
    ],
    ids=[
        "shim-eth0s-ips",
        "shim-mismatch",
        "shim-nothing-to-make-true",
        "shim-control-runtime-has-an-ip",
        "native-eth0s-among-the-runtimes",
        "native-mismatch-missed",
        "native-lacks-one-readded",
        "native-lacks-one-no-ip-missed",
        "secondary-control-never-listed-with-ips",
        "secondary-control-listed-with-ips",
    ],
)
def test_each_mode_reads_the_runtimes_ips(mode, reading, record, answer):
    assert mode.runtime_ips(reading, record) == answer


def test_secondary_mode_tells_the_runtimes_network_lost():
    """A pod listed with IPs, now listed without, with nri-cni's networks: the runtime's own
    network is gone. The controls are the table's two secondary rows (never listed with IPs;
    listed with an IP now)."""
    lost = SECONDARY.runtime_ips(_reading(()), _record(ips_lost=True)).lost
    assert lost.startswith("the runtime reports no IP for it: its own network of the pod is gone")
