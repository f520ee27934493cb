"""The bounded JSON reader, property-tested: within its limits it reads what json reads, and on
any bytes (random, or nested past the limit) it raises only ValueError."""

from __future__ import annotations

import json

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
