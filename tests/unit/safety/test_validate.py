"""The GC's valid-attachments list (nri_cni/safety/validate.py: gc_valid_ids): each item's
containerID and ifname are checked; any bad item refuses the whole GC, since reading a bad list
as "nothing is valid" would delete every live pod's networks."""

from __future__ import annotations

import pytest

from nri_cni.safety.validate import InvalidInput, gc_valid_ids

OK = {"containerID": "c1", "ifname": "eth0"}


@pytest.mark.parametrize("key", ["cni.dev/valid-attachments", "cni.dev/attachments"])
def test_the_valid_ids_of_a_gc(key):
    conf = {key: [OK, {"containerID": "c2", "ifname": "net1"}, {"containerID": "c1", "ifname": "net1"}]}
    assert gc_valid_ids(conf) == {"c1", "c2"}


@pytest.mark.parametrize("conf", [{}, {"cni.dev/valid-attachments": None}, {"cni.dev/valid-attachments": []}])
def test_no_list_means_no_valid_ids(conf):
    assert gc_valid_ids(conf) == set()


@pytest.mark.parametrize(
    "item",
    [
        {"containerID": "c1", "ifname": ""},
        {"containerID": "c1", "ifname": "a/b"},
        {"containerID": "c1", "ifname": "eth:0"},
        {"containerID": "c1", "ifname": "x" * 16},
        {"containerID": "c1", "ifname": ".."},
        {"containerID": "c1", "ifname": 0},
        {"containerID": "c1"},
        {"containerID": "", "ifname": "eth0"},
        {"containerID": "../c1", "ifname": "eth0"},
        {"containerID": 1, "ifname": "eth0"},
        {"ifname": "eth0"},
        "c1",
        ["c1", "eth0"],
    ],
)
def test_one_bad_item_refuses_the_whole_gc(item):
    """Control case: the same list with OK in place of `item` is read (test above); and the
    item comes after a good one, so a check that looks only at the first item is caught."""
    assert gc_valid_ids({"cni.dev/valid-attachments": [OK, OK]}) == {"c1"}
    with pytest.raises(InvalidInput):
        gc_valid_ids({"cni.dev/valid-attachments": [OK, item]})


@pytest.mark.parametrize("value", [{"containerID": "c1", "ifname": "eth0"}, "c1", 1])
def test_a_list_is_required(value):
    with pytest.raises(InvalidInput):
        gc_valid_ids({"cni.dev/valid-attachments": value})


def test_the_first_key_wins():
    conf = {
        "cni.dev/valid-attachments": [OK],
        "cni.dev/attachments": [{"containerID": "c9", "ifname": "eth0"}],
    }
    assert gc_valid_ids(conf) == {"c1"}
