"""CNI_ARGS has one parser (nri_cni.validate.cni_args_pairs): the daemon's shim path reads it by
key, `nri-cni cni` keeps the pairs in their order (the plugins see them so); both refuse alike."""

from __future__ import annotations

import pytest

from nri_cni.cli import cnitool as cli
from nri_cni.safety import validate


def test_the_cli_keeps_the_order_the_daemon_reads_by_key():
    text = "K8S_POD_NAMESPACE=nct;IP=10.1.0.5;K8S_POD_NAME=web-0;;Z=last;A="
    pairs = [
        ("K8S_POD_NAMESPACE", "nct"),
        ("IP", "10.1.0.5"),
        ("K8S_POD_NAME", "web-0"),
        ("Z", "last"),
        ("A", ""),
    ]
    assert cli.parse_cni_args(text) == validate.cni_args_pairs(text) == pairs
    assert validate.parse_cni_args(text) == dict(pairs)
    assert validate.parse_cni_args("K=1;K=2") == {"K": "2"} and cli.parse_cni_args("K=1;K=2") == [
        ("K", "1"),
        ("K", "2"),
    ]


@pytest.mark.parametrize(
    "text",
    [
        "K8S_POD_NAME",
        "a b=c",
        "K=v=w",
        "K=a\x07b",
        "K8S_POD_NAME=a/b",
        "K8S_POD_INFRA_CONTAINER_ID=../x",
    ],
)
def test_both_refuse_what_one_refuses(text):
    with pytest.raises(validate.InvalidInput):
        validate.parse_cni_args(text)
    with pytest.raises(cli._UsageError) as err:
        cli.parse_cni_args(text)
    assert err.value.code == 4
