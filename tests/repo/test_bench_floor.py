"""The benches' floor mode (bench_pods.py, bench_crio.py): the runtime's own CNI with the shim
chained after its last plugin, answered by bench/null_plugin.py. What the null daemon answers
decides whether the runtime's pod gets the chain's own result; the ratios it is compared by
decide the floor rows. (The smoke bench in CI runs the mode on both runtimes.)"""

from __future__ import annotations

import json

import pytest

from bench.bench_pods import describe_floor, floor_compare
from bench.null_plugin import answer
from nri_cni.local import proto as localproto

PREV = {"cniVersion": "1.0.0", "ips": [{"address": "10.246.177.5/24"}], "interfaces": [{"name": "eth0"}]}


def test_an_add_is_answered_with_the_result_it_was_given():
    body = json.dumps({"cniVersion": "1.0.0", "type": "nri-cni-shim", "prevResult": PREV}).encode()
    status, payload = answer({"CNI_COMMAND": "ADD"}, body)
    assert (status, json.loads(payload)) == (localproto.STATUS_OK, PREV)


@pytest.mark.parametrize(
    "command, conf",
    [
        ("ADD", {"cniVersion": "1.0.0", "type": "nri-cni-shim"}),  # not chained after a plugin
        ("ADD", {"cniVersion": "1.0.0", "prevResult": "10.246.177.5"}),
        ("", {"cniVersion": "1.0.0", "prevResult": PREV}),
        ("VERSION", {"cniVersion": "1.0.0"}),  # the shim answers it itself
    ],
)
def test_what_the_floor_has_no_answer_for_is_a_cni_error(command, conf):
    status, payload = answer({"CNI_COMMAND": command}, json.dumps(conf).encode())
    error = json.loads(payload)
    assert status == localproto.STATUS_ERROR
    assert (error["code"], error["cniVersion"]) == (4, "1.0.0")
    assert repr(command) in error["msg"]


@pytest.mark.parametrize("command", ["DEL", "CHECK", "GC", "STATUS"])
def test_the_other_verbs_succeed_with_nothing(command):
    body = json.dumps({"cniVersion": "1.0.0", "prevResult": PREV}).encode()
    assert answer({"CNI_COMMAND": command}, body) == (localproto.STATUS_OK, b"")


def _mode(run: float, stop_remove: float, spread: float = 0.0) -> dict:
    """A mode's summary and its 9 pods: run and stop+remove around their medians (stop and
    remove split in halves), `spread` ms either side."""
    offsets = [spread * (i - 4) / 4 for i in range(9)]
    runs = [run + d for d in offsets]
    stops = [stop_remove / 2 + d for d in offsets]
    return {
        "run": {"median": run},
        "stop_remove": {"median": stop_remove},
        "raw": {"run": runs, "stop": stops, "remove": [stop_remove / 2] * 9},
    }


def test_the_floor_is_compared_with_the_runtimes_own_and_the_shim_with_the_floor():
    modes = {"own": _mode(100.0, 60.0), "shim": _mode(108.0, 70.0), "floor": _mode(104.0, 66.0)}
    assert floor_compare(modes, own="own", shim="shim", floor="floor") == {
        "floor_vs_own": {"run": 1.04, "stop_remove": 1.1},
        "shim_vs_floor": {"run": 1.038, "stop_remove": 1.061},
        # pods without spread: each interval is its ratio
        "floor_vs_own_interval": {"run": (1.04, 1.04), "stop_remove": (1.1, 1.1)},
        "shim_vs_floor_interval": {"run": (1.038, 1.038), "stop_remove": (1.061, 1.061)},
        "floor_run_median_ms": 104.0,
        "floor_stop_remove_median_ms": 66.0,
    }
    # control: the names decide which mode is which
    swapped = floor_compare(modes, own="own", shim="floor", floor="shim")
    assert swapped["floor_vs_own"] == {"run": 1.08, "stop_remove": 1.167}
    assert swapped["floor_vs_own_interval"] == {"run": (1.08, 1.08), "stop_remove": (1.167, 1.167)}


def test_the_floors_interval_comes_from_each_sides_pods():
    """A floor whose pods spread widely cannot be told from the runtime's own in one run; the
    same medians with tight pods can. Stop+remove adds each pod's stop and remove."""
    tight = floor_compare(
        {"own": _mode(100.0, 60.0, 1.0), "shim": _mode(110.0, 70.0, 1.0), "floor": _mode(105.0, 66.0, 1.0)},
        own="own",
        shim="shim",
        floor="floor",
    )
    wide = floor_compare(
        {
            "own": _mode(100.0, 60.0, 20.0),
            "shim": _mode(110.0, 70.0, 20.0),
            "floor": _mode(105.0, 66.0, 20.0),
        },
        own="own",
        shim="shim",
        floor="floor",
    )
    for what, ratio in (("run", 1.05), ("stop_remove", 1.1)):
        lo, hi = tight["floor_vs_own_interval"][what]
        assert 1.0 < lo <= ratio <= hi < 1.2
        lo, hi = wide["floor_vs_own_interval"][what]
        assert lo < 1.0 and hi > 1.1
    lo, hi = tight["shim_vs_floor_interval"]["run"]
    assert 1.0 < lo <= 1.048 <= hi


def test_describe_floor_gives_each_ratio_its_interval():
    modes = {"own": _mode(100.0, 60.0), "shim": _mode(108.0, 70.0), "floor": _mode(104.0, 66.0)}
    text = describe_floor(floor_compare(modes, own="own", shim="shim", floor="floor"), "CRI-O's own")
    assert text == (
        "  the floor (CRI-O's own + a null shim chained + a null NRI plugin) / CRI-O's own: creation "
        "1.040 (95 % interval 1.040-1.040), stop+remove 1.100 (95 % interval 1.100-1.100); nri-cni's "
        "shim / the floor: creation 1.038 (95 % interval 1.038-1.038), stop+remove 1.061 (95 % interval "
        "1.061-1.061)"
    )
