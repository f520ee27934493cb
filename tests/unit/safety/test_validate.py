"""Input validation (nri_cni/safety/validate.py). The GC's valid-attachments list (nri_cni/safety/validate.py: gc_valid_ids): each item's
containerID and ifname are checked; any bad item refuses the whole GC, since reading a bad list
as "nothing is valid" would delete every live pod's networks."""

from __future__ import annotations

import pytest

from nri_cni.safety.validate import (
    MAX_ARG_VALUE_BYTES,
    InvalidInput,
    cap_text,
    check_id,
    check_ifname,
    check_k8s_value,
    check_pod,
    check_selection,
    cni_args_pairs,
    cni_version,
    gc_valid_ids,
    ifname_problem,
    is_valid_id,
    quote,
    quote_whole,
    shown,
)

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


def refusal(fn, *args, **kw) -> str:
    with pytest.raises(InvalidInput) as info:
        fn(*args, **kw)
    return str(info.value)


@pytest.mark.parametrize(
    "item, words",
    [
        ({"containerID": 1, "ifname": "eth0"}, "needs string containerID and ifname"),
        ({"containerID": "c1", "ifname": 0}, "needs string containerID and ifname"),
        ("c1", "cni.dev/valid-attachments[1] must be an object"),
        ({"containerID": "../c1", "ifname": "eth0"}, "cni.dev/valid-attachments[1].containerID '../c1'"),
        ({"containerID": "c1", "ifname": "a/b"}, "cni.dev/valid-attachments[1].ifname: interface name 'a/b'"),
    ],
)
def test_a_gc_refusal_names_the_item_and_the_rule(item, words):
    assert words in refusal(gc_valid_ids, {"cni.dev/valid-attachments": [OK, item]})


def test_a_gc_refusal_of_a_non_list_names_its_type():
    assert "must be a list of {containerID, ifname}, not dict" in refusal(
        gc_valid_ids, {"cni.dev/valid-attachments": OK}
    )


@pytest.mark.parametrize(
    "value, limit, quoted",
    [
        ("abc", 200, "'abc'"),
        (5, 200, "'5'"),  # not a string: its repr, quoted
        ("a\nb", 200, "'a\\nb'"),
        ("x" * 3, 3, "'xxx'"),  # exactly the limit: whole
        ("x" * 5, 3, "'xxx'...(+2 characters)"),
    ],
)
def test_quote(value, limit, quoted):
    assert quote(value, limit) == quoted


def test_quote_whole_never_cuts():
    assert quote_whole("x" * 300 + "\n") == repr("x" * 300 + "\n")


@pytest.mark.parametrize(
    "text, limit, capped",
    [("abc", 3, "abc"), ("abcd", 3, "abc...(+1 characters)"), ("abcdef", 2, "ab...(+4 characters)")],
)
def test_cap_text(text, limit, capped):
    assert cap_text(text, limit) == capped


@pytest.mark.parametrize(
    "text, limit, out",
    [
        ("abc", 3, "abc"),  # printable, at the limit: as it is
        ("abcd", 3, "'abc'...(+1 characters)"),
        ("a\tb", 200, "'a\\tb'"),
    ],
)
def test_shown(text, limit, out):
    assert shown(text, limit) == out


@pytest.mark.parametrize(
    "value, out",
    [("1.1.0", "1.1.0"), ("10.20.300", "10.20.300"), ("1.1", "0.4.0"), ("1.1.0x", "0.4.0"), (110, "0.4.0")],
)
def test_cni_version(value, out):
    assert cni_version(value, "0.4.0") == out


def test_check_id_names_what_was_refused():
    assert check_id("c-1.x_y") == "c-1.x_y"
    assert refusal(check_id, "") == "CNI_CONTAINERID is empty"
    assert refusal(check_id, "../x", "pod id").startswith("pod id '../x' is not a valid id")


def test_check_ifname_names_what_was_refused():
    assert check_ifname("eth0") == "eth0"
    assert refusal(check_ifname, "a/b", "GC ifname").startswith("GC ifname: interface name 'a/b' has '/'")


@pytest.mark.parametrize(
    "text, pairs",
    [
        ("A=1;;B=", [("A", "1"), ("B", "")]),
        ("FOO=-x", [("FOO", "-x")]),  # only the infra container id must be an id (control below)
        ("K8S_POD_INFRA_CONTAINER_ID=abc", [("K8S_POD_INFRA_CONTAINER_ID", "abc")]),
        ("K8S_POD_INFRA_CONTAINER_ID=", [("K8S_POD_INFRA_CONTAINER_ID", "")]),
        ("X=" + "a" * MAX_ARG_VALUE_BYTES, [("X", "a" * MAX_ARG_VALUE_BYTES)]),
        ("K8S_POD_NAME=" + "a" * MAX_ARG_VALUE_BYTES, [("K8S_POD_NAME", "a" * MAX_ARG_VALUE_BYTES)]),
    ],
)
def test_cni_args_accepted(text, pairs):
    assert cni_args_pairs(text) == pairs


@pytest.mark.parametrize(
    "text, words",
    [
        ("A=b=c", "CNI_ARGS A: value 'b=c' holds '='"),
        ("X=" + "a" * (MAX_ARG_VALUE_BYTES + 1), "CNI_ARGS X: value"),
        ("A=b\x01", "CNI_ARGS A: value 'b\\x01' holds control characters"),
        ("1A=b", "CNI_ARGS item '1A=b' is not KEY=VALUE"),
        ("K8S_POD_NAME=a b", "CNI_ARGS K8S_POD_NAME 'a b' is not a Kubernetes name"),
        ("K8S_POD_INFRA_CONTAINER_ID=-x", "CNI_ARGS K8S_POD_INFRA_CONTAINER_ID '-x' is not a valid id"),
    ],
)
def test_cni_args_refused(text, words):
    assert words in refusal(cni_args_pairs, text)


def test_check_k8s_value():
    assert check_k8s_value("a" * MAX_ARG_VALUE_BYTES, "name") == "a" * MAX_ARG_VALUE_BYTES
    assert refusal(check_k8s_value, "a" * (MAX_ARG_VALUE_BYTES + 1), "name").startswith("name 'aaa")
    assert (
        refusal(check_k8s_value, 5, "name")
        == "name '5' is not a Kubernetes name (letters, digits, '_', '.', '-')"
    )


@pytest.mark.parametrize(
    "pod, words",
    [
        (("../x", "n", "ns", "u"), "NRI pod id '../x'"),
        (("p1", "a b", "ns", "u"), "NRI pod name 'a b'"),
        (("p1", "n", "a b", "u"), "NRI pod namespace 'a b'"),
        (("p1", "n", "ns", "a b"), "NRI pod uid 'a b'"),
    ],
)
def test_check_pod_names_the_field(pod, words):
    check_pod("p1", "n", "ns", "u", "NRI")  # the control case: all four good
    assert refusal(check_pod, *pod, "NRI").startswith(words)


def test_check_selection_limits():
    check_selection(["a", "b"], max_networks=2, max_per_network=1, where="pod p")  # at both limits
    assert "3 networks for one pod, more than the limit of 2 (limits.networks_per_pod)" in refusal(
        check_selection, ["a", "b", "c"], max_networks=2, max_per_network=1, where="pod p"
    )
    assert "network 'a' attached 2 times to one pod, more than the limit of 1" in refusal(
        check_selection, ["a", "b", "a"], max_networks=3, max_per_network=1, where="pod p"
    )


@pytest.mark.parametrize(
    "name, problem",
    [
        ("eth0", ""),
        ("X1", ""),  # letters beyond the refused ones are fine (control of the next rows)
        ("a/b", "has '/', ':', whitespace or a control character"),
        ("a:b", "has '/', ':', whitespace or a control character"),
        ("a b", "has '/', ':', whitespace or a control character"),
        ("a\x01b", "has '/', ':', whitespace or a control character"),  # a control, not a space
        ("a\u200bb", "has '/', ':', whitespace or a control character"),  # Cf: a format character
        ("..", "is not allowed"),
        ("", "is empty"),
        (None, "must be a string"),
        ("x" * 16, "is 16 bytes long (at most 15)"),
    ],
)
def test_ifname_problem(name, problem):
    assert ifname_problem(name) == problem


def test_check_ifname_names_cni_ifname_by_default():
    assert refusal(check_ifname, "") == "CNI_IFNAME: interface name '' is empty"


@pytest.mark.parametrize("value, valid", [("a" * 128, True), ("a" * 129, False), ("a", True), ("", False)])
def test_an_id_is_1_to_128_characters(value, valid):
    assert is_valid_id(value) is valid
