"""The benches' floor mode (bench_pods.py, bench_crio.py): the runtime's own CNI with the shim
chained after its last plugin, answered by bench/null_plugin.py. What the null daemon answers
decides whether the runtime's pod gets the chain's own result; the ratios it is compared by
decide the floor rows. (The smoke bench in CI runs the mode on both runtimes.)"""

from __future__ import annotations

import json

import pytest

from bench.bench_pods import floor_compare
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


def _mode(run: float, stop_remove: float) -> dict:
    return {"run": {"median": run}, "stop_remove": {"median": stop_remove}}


def test_the_floor_is_compared_with_the_runtimes_own_and_the_shim_with_the_floor():
    modes = {"own": _mode(100.0, 60.0), "shim": _mode(108.0, 70.0), "floor": _mode(104.0, 66.0)}
    assert floor_compare(modes, own="own", shim="shim", floor="floor") == {
        "floor_vs_own": {"run": 1.04, "stop_remove": 1.1},
        "shim_vs_floor": {"run": 1.038, "stop_remove": 1.061},
        "floor_run_median_ms": 104.0,
        "floor_stop_remove_median_ms": 66.0,
    }
    # control: the names decide which mode is which
    swapped = floor_compare(modes, own="own", shim="floor", floor="shim")
    assert swapped["floor_vs_own"] == {"run": 1.08, "stop_remove": 1.167}
