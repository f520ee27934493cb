"""What .ci/run counts as a CRI-O test (tests/support/crio.py is_crio_test): CRI-O's end-to-end
tests only, so that "every collected one passed" compares like with like."""

from __future__ import annotations

import pytest

from tests.support.crio import is_crio_test


@pytest.mark.parametrize(
    "nodeid, crio",
    [
        ("tests/e2e/test_crio_faults.py::test_x", True),
        ("tests/e2e/test_containers.py::test_c[crio-shim]", True),
        ("tests/e2e/test_runtimes.py::test_r[crio]", True),
        ("tests/e2e/test_runtimes.py::test_r[containerd]", False),  # the control: same test, other runtime
        ("tests/repo/test_bench_goals.py::test_a_rows_verdict[crio_creation_records-1.5--]", False),
        ("tests/integration/ci/test_install_deps_crio.py::test_crio_is_unpacked", False),
        ("tests/repo/test_manifests.py::test_crio_dropin", False),
    ],
)
def test_only_cri_os_end_to_end_tests_count(nodeid, crio):
    assert is_crio_test(nodeid) is crio
