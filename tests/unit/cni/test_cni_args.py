"""CNI_ARGS has one parser (nri_cni.safety.validate.cni_args_pairs): the daemon's shim path reads
its pairs by key, `nri-cni cni --args` keeps them in their order (the plugins see them so); both
refuse alike."""

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
    assert cli.args_option(text) == validate.cni_args_pairs(text) == pairs
    assert cli.args_option("K=1;K=2") == [("K", "1"), ("K", "2")]


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
        validate.cni_args_pairs(text)
    with pytest.raises(cli._UsageError) as err:
        cli.args_option(text)
    assert err.value.code == 4
