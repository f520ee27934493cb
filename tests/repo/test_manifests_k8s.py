"""The DaemonSet manifests against Kubernetes' own OpenAPI schemas, offline and strict
(kubernetes-validate; .ci/run runs its command line on the same files)."""

from __future__ import annotations

import copy
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = sorted((ROOT / "config" / "kubernetes").glob("*.yaml"))
VERSIONS = ("1.31.0", "1.37.0")  # as in .ci/run


def documents():
    for path in MANIFESTS:
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                yield path.name, doc


@pytest.mark.parametrize("version", VERSIONS)
def test_every_manifest_validates_strictly(version):
    checked = []
    for name, doc in documents():
        kubernetes_validate.validate(doc, version, strict=True)
        checked.append((name, doc["kind"]))
    assert ("nri-cni.yaml", "DaemonSet") in checked and ("nri-cni.yaml", "ConfigMap") in checked


def test_the_check_catches_a_wrong_field():
    (ds,) = [copy.deepcopy(d) for _, d in documents() if d["kind"] == "DaemonSet"]
    ds["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["exec"]["commands"] = ["x"]
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(ds, VERSIONS[-1], strict=True)


def test_ci_runs_the_same_check():
    text = (ROOT / ".ci" / "run").read_text()
    assert 'kubernetes-validate" --strict' in text and "config/kubernetes/*.yaml" in text
    for version in VERSIONS:
        assert version in text
