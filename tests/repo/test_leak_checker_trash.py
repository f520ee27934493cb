"""The leak checker and nri-cni's trash directories (tests/support/leaks.py TRASH_DIRS): a file
the daemon renamed there to unlink a moment later is waited for; one that stays is a leak."""

from __future__ import annotations

import pytest

from tests.support import leaks
from tests.support.leaks import LeakChecker


@pytest.mark.parametrize("unlinked", [True, False], ids=["unlinked-while-waited-for", "control-stays"])
def test_a_file_in_a_trash_directory_is_waited_for(tmp_path, monkeypatch, unlinked):
    checker = LeakChecker(dirs=[tmp_path], firewall=False).start()
    trash = tmp_path / "cache" / "results-deleted"
    trash.mkdir(parents=True)
    (trash / "net-c-eth0.12.0").write_text("{}")
    slept: list[float] = []

    def sleep(seconds: float) -> None:  # the daemon's worker unlinks it while the checker waits
        slept.append(seconds)
        if unlinked:
            (trash / "net-c-eth0.12.0").unlink(missing_ok=True)

    monkeypatch.setattr(leaks.time, "sleep", sleep)
    monkeypatch.setattr(leaks, "TRASH_WAIT", 0.2)
    found = checker.leaks()
    assert slept  # it waited
    if unlinked:
        assert found == []
    else:
        assert found == [f"file {tmp_path}/cache/results-deleted/net-c-eth0.12.0 left behind"]


def test_a_file_elsewhere_is_a_leak_at_once(tmp_path, monkeypatch):
    checker = LeakChecker(dirs=[tmp_path], firewall=False).start()
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "net-c-eth0").write_text("{}")
    monkeypatch.setattr(leaks.time, "sleep", lambda s: pytest.fail("waited for a file in no trash"))
    assert checker.leaks() == [f"file {tmp_path}/results/net-c-eth0 left behind"]
