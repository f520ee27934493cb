"""The bounded JSON reader, property-tested: within its limits it reads what json reads, and on
any bytes (random, or nested past the limit) it raises only ValueError."""

from __future__ import annotations

import json

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nri_cni.safety import jsonlimits

_json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=10)),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=5), inner, max_size=4)
    ),
    max_leaves=30,
)


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(value=_json_values)
def test_jsonlimits_reads_what_json_reads_within_the_limits(value):
    text = json.dumps(value)
    assert jsonlimits.loads(text) == json.loads(text)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    data=st.one_of(
        st.binary(max_size=300),
        st.integers(0, 200_000).map(lambda n: b"[" * n),
        st.integers(60, 70).map(lambda n: b"[" * n + b"]" * n),
        st.integers(0, 5_000).map(lambda n: b'{"a":' * n + b"1" + b"}" * n),
        st.integers(1, 3000).map(lambda n: b'["\\"[' * n),
    )
)
def test_jsonlimits_raises_only_valueerror_on_any_bytes(data):
    try:
        value = jsonlimits.loads(data)
    except ValueError:
        return
    assert value == json.loads(data)


@pytest.mark.parametrize(
    "data, refused",
    [
        (b"[[[]]]", False),  # the control case: exactly max_depth (3) levels
        (b"[[[[]]]]", True),
        (b'{"a":{"b":[1]}}', False),
        (b'{"a":{"b":[{}]}}', True),
        (b"[[1],[[2]],[[3]]]", False),  # many openings, none deeper than 3
        (b"[[1],[[2]],[[[3]]]]", True),  # the deep part is not at the start
        (b'["[[[[", "{{{{"]', False),  # brackets inside strings do not count
        (b'["\\"[[[[", 1]', False),  # nor after an escaped quote
        (b"[[[[", True),  # unbalanced, but already too deep
        (b"[]]]]]", False),  # unbalanced: left to the parser
        (b"[[][[][[]]]]", True),
    ],
)
def test_check_depth(data, refused):
    if refused:
        with pytest.raises(jsonlimits.JsonLimitError, match="^nested deeper than 3 levels$"):
            jsonlimits.check_depth(data, 3)
    else:
        jsonlimits.check_depth(data, 3)


@pytest.mark.parametrize("size, refused", [(10, False), (11, True)])  # the control: at the limit
def test_loads_refuses_a_document_over_its_size_limit(size, refused):
    data = b'"' + b"a" * (size - 2) + b'"'
    if refused:
        with pytest.raises(jsonlimits.JsonLimitError, match=f"^{size} bytes, over the limit of 10$"):
            jsonlimits.loads(data, max_bytes=10)
    else:
        assert jsonlimits.loads(data, max_bytes=10) == "a" * (size - 2)


def test_loads_measures_text_in_utf8_bytes_and_reads_lone_surrogates_as_json_does():
    assert jsonlimits.loads('"\u00e9\u00e9"', max_bytes=6) == "\u00e9\u00e9"  # the control: 6 bytes
    with pytest.raises(jsonlimits.JsonLimitError):
        jsonlimits.loads('"\u00e9\u00e9\u00e9"', max_bytes=7)  # 8 bytes, though 5 characters
    assert jsonlimits.loads('"\ud800"') == json.loads('"\ud800"') == "\ud800"


def test_loads_default_limits():
    assert jsonlimits.loads(b"[" * 64 + b"]" * 64) == eval("[" * 64 + "]" * 64)  # the control
    with pytest.raises(jsonlimits.JsonLimitError, match="^nested deeper than 64 levels$"):
        jsonlimits.loads(b"[" * 65 + b"]" * 65)
    big = b'"' + b"a" * (jsonlimits.MAX_BYTES - 2) + b'"'
    assert len(jsonlimits.loads(big)) == jsonlimits.MAX_BYTES - 2
    with pytest.raises(jsonlimits.JsonLimitError):
        jsonlimits.loads(big + b" ")


@pytest.mark.parametrize(
    "text, error",
    [
        ("a: [[1]]", None),  # the control case: 4 levels (the mapping, two lists, the scalar)
        ("a: [[[1]]]", "nested deeper than 4 levels"),
        ("a: &x 1\nb: *x", "aliases (*name) are not allowed in nri-cni's config"),
        ("a: " + "b" * 30, "the document is over the limit of 32 bytes"),
        ("a: " + "b" * 29, None),
    ],
)
def test_yaml_load_limits(text, error):
    if error is None:
        assert jsonlimits.yaml_load(text, max_bytes=32, max_depth=4)
    else:
        with pytest.raises(yaml.YAMLError) as err:
            jsonlimits.yaml_load(text, max_bytes=32, max_depth=4)
        assert error in str(err.value)


def _cycles_left_by(read, times: int = 50) -> int:
    """How many objects `times` calls of `read` leave that only the cycle collector frees."""
    import gc

    gc.collect()
    gc.disable()
    try:
        for _ in range(times):
            read()
        return gc.collect()
    finally:
        gc.enable()


def test_a_yaml_read_leaves_no_reference_cycle():
    """The daemon reads its config on every change of its folder: a cycle a read piles up until
    the collector runs. Control: a class made per read (what yaml_load did) is seen."""

    def class_per_read():
        class Loader(yaml.SafeLoader):
            pass

        loader = Loader("a: 1")
        try:
            return loader.get_single_data()
        finally:
            loader.dispose()

    assert _cycles_left_by(class_per_read) >= 50  # control: the counter sees such cycles
    assert _cycles_left_by(lambda: jsonlimits.yaml_load("a: 1")) < 50


@pytest.mark.parametrize(
    "doc, max_depth, error",
    [
        (b"[[[1]]]", 2, "nested deeper than 2 levels"),  # the caller's limit, not the default
        (b"[[[1]]]", 3, None),  # control: at the limit
        # unbalanced once the pairs are gone: the parser's syntax error, not a limit
        (b"[[]][[]]]", 2, "Extra data"),
        (b"[[],[]]", 2, None),  # control: as many openings (past the shortcut), balanced
    ],
)
def test_loads_takes_the_callers_depth_and_leaves_syntax_to_the_parser(doc, max_depth, error):
    if error is None:
        assert jsonlimits.loads(doc, max_depth=max_depth) is not None
        return
    with pytest.raises(ValueError) as caught:
        jsonlimits.loads(doc, max_depth=max_depth)
    assert error in str(caught.value)
    assert isinstance(caught.value, jsonlimits.JsonLimitError) == error.startswith("nested")


def test_a_limit_past_the_parsers_recursion_is_still_a_limit_error():
    """A caller's depth limit above what the parsers can recurse: their RecursionError leaves as
    the limit's error (JSON: JsonLimitError; YAML: YAMLError), naming the limit."""
    deep = "[" * 3000 + "]" * 3000
    with pytest.raises(jsonlimits.JsonLimitError, match="^nested deeper than 100000 levels$"):
        jsonlimits.loads(deep.encode(), max_depth=100_000)
    with pytest.raises(yaml.YAMLError, match="^nested deeper than 100000 levels$"):
        jsonlimits.yaml_load(deep, max_depth=100_000)
