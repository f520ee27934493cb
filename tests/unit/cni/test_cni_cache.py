"""libcni's cache format, byte for byte, and the tolerant / atomic file handling."""

from __future__ import annotations

import logging
import os
import stat
import threading
from pathlib import Path

import pytest

from nri_cni.cni.cache import CacheEntry, ResultCache
from nri_cni.errors import ConfigError
from tests.support.golden_cache import GOLDEN, golden_entry


def test_golden_bytes_written_exactly(tmp_path):
    cache = ResultCache(str(tmp_path))
    cache.write(golden_entry())
    path = tmp_path / "results" / "nct-golden-c0ffee-eth0"
    assert path.read_bytes() == GOLDEN
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "results").stat().st_mode) == 0o700
    assert os.listdir(tmp_path / "results") == ["nct-golden-c0ffee-eth0"]  # no temp file left


def test_golden_read(tmp_path):
    entry = CacheEntry.from_json(GOLDEN, "p")
    want = golden_entry()
    want.path = "p"
    assert entry == want


def test_minimal_entry_omits_empty_fields():
    entry = CacheEntry(container_id="c", ifname="eth0", network_name="n", config=b"{}")
    assert (
        entry.to_json()
        == b'{"kind":"cniCacheV1","containerId":"c","config":"e30=","ifName":"eth0","networkName":"n"}'
    )


def test_keys_read_case_insensitively():
    # ocicni writes "containerID"; Go's decoder folds case
    data = GOLDEN.replace(b'"containerId"', b'"containerID"').replace(b'"ifName"', b'"ifname"')
    entry = CacheEntry.from_json(data)
    assert (entry.container_id, entry.ifname) == ("c0ffee", "eth0")


def test_rewrite_replaces(tmp_path):
    cache = ResultCache(str(tmp_path))
    cache.write(golden_entry())
    entry = golden_entry()
    entry.netns = "/var/run/netns/other"
    cache.write(entry)
    assert cache.read("nct-golden", "c0ffee", "eth0").netns == "/var/run/netns/other"


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"  \n",
        b"{trunc",
        b"[]",
        b'{"kind":"other"}',
        b'{"kind":"cniCacheV1","config":"***"}',
        b'{"kind":"cniCacheV1","cniArgs":[["a"]]}',
    ],
)
def test_corrupt_entries(tmp_path, caplog, content):
    cache = ResultCache(str(tmp_path))
    path = Path(cache.path("n", "c", "eth0"))
    path.parent.mkdir(parents=True)
    path.write_bytes(content)
    with caplog.at_level(logging.WARNING):
        assert cache.read("n", "c", "eth0") is None
    assert "corrupt" in caplog.text
    assert path.exists()
    assert cache.read("n", "c", "eth0", drop_corrupt=True) is None
    assert not path.exists()


def test_missing_entry(tmp_path):
    cache = ResultCache(str(tmp_path))
    assert cache.read("n", "c", "eth0") is None
    cache.delete("n", "c", "eth0")  # deleting nothing is fine


def test_path_cannot_escape(tmp_path):
    cache = ResultCache(str(tmp_path))
    for cid in ("../../etc/x", "a/b", ""):
        with pytest.raises(ConfigError):
            cache.path("n", cid, "eth0")


def test_entries_filters(tmp_path):
    cache = ResultCache(str(tmp_path))
    for net, cid, ifname in (
        ("net-a", "c1", "eth0"),
        ("net-a", "c2", "eth0"),
        ("net-b", "c1", "net1"),
        ("a-c1-b", "c3", "eth0"),
    ):
        cache.write(CacheEntry(container_id=cid, ifname=ifname, network_name=net, config=b"{}"))
    results = tmp_path / "results"
    (results / "net-a-c9-eth0").write_text("{corrupt")
    (results / ".net-a-c1-eth1.1.2.tmp").write_bytes(
        CacheEntry(container_id="c1", ifname="eth1", network_name="net-a", config=b"{}").to_json()
    )
    key = lambda e: (e.network_name, e.container_id, e.ifname)  # noqa: E731
    assert [key(e) for e in cache.entries()] == [
        ("a-c1-b", "c3", "eth0"),
        ("net-a", "c1", "eth0"),
        ("net-a", "c2", "eth0"),
        ("net-b", "c1", "net1"),
    ]
    # the file name of "a-c1-b" contains "-c1-", but its JSON says c3
    assert [key(e) for e in cache.entries(container_id="c1")] == [
        ("net-a", "c1", "eth0"),
        ("net-b", "c1", "net1"),
    ]
    assert [key(e) for e in cache.entries(network="net-a")] == [
        ("net-a", "c1", "eth0"),
        ("net-a", "c2", "eth0"),
    ]
    assert all(e.path.startswith(str(results)) for e in cache.entries())
    assert ResultCache(str(tmp_path / "none")).entries() == []


def test_deferred_durability(tmp_path):
    cache = ResultCache(str(tmp_path))
    cache.write(golden_entry(), durable=False)
    path = tmp_path / "results" / "nct-golden-c0ffee-eth0"
    assert path.read_bytes() == GOLDEN and os.listdir(path.parent) == [path.name]
    cache.sync("nct-golden", "c0ffee", "eth0")
    cache.delete("nct-golden", "c0ffee", "eth0")
    cache.sync("nct-golden", "c0ffee", "eth0")  # deleted before its sync: nothing to do


def test_prepared_write(tmp_path):
    """A write begun before the result is known: prepare() makes only a temporary file,
    commit() gives the bytes of a one-step write, discard() leaves nothing."""
    cache = ResultCache(str(tmp_path / "cache"))
    entry = CacheEntry(
        container_id="c1",
        ifname="eth0",
        network_name="net",
        config=b'{"a":1}',
        netns="/var/run/netns/x",
        cni_args=[("K8S_POD_NAME", "p")],
    )
    result = {"cniVersion": "1.1.0", "ips": [{"address": "10.0.0.2/24"}]}
    w = cache.prepare(entry)
    w.prepare()
    (tmp,) = os.listdir(cache.results_dir)
    assert tmp.startswith(".") and tmp.endswith(".tmp")
    w.commit(result, durable=False)
    assert os.listdir(cache.results_dir) == ["net-c1-eth0"]
    full = CacheEntry(**{**entry.__dict__, "result": result})
    assert (tmp_path / "cache/results/net-c1-eth0").read_bytes() == full.to_json()
    with pytest.raises(RuntimeError):
        w.commit(result)

    gone = cache.prepare(CacheEntry(container_id="c2", ifname="eth0", network_name="net", config=b"{}"))
    gone.prepare()
    gone.discard()
    gone.prepare()  # too late (a call_soon that ran after the failure): makes nothing
    assert os.listdir(cache.results_dir) == ["net-c1-eth0"]

    unprepared = cache.prepare(CacheEntry(container_id="c3", ifname="eth0", network_name="net", config=b"{}"))
    unprepared.commit(None)
    assert cache.read("net", "c3", "eth0").result is None


def test_sync_later(tmp_path, monkeypatch):
    cache = ResultCache(str(tmp_path / "cache"))
    cache.write(CacheEntry(container_id="c1", ifname="eth0", network_name="net", config=b"{}"), durable=False)
    synced = []
    real_fsync = os.fsync
    done = threading.Event()

    def spy(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)
        if os.path.isdir(synced[-1]):
            done.set()

    monkeypatch.setattr(os, "fsync", spy)
    cache.sync_later("net", "c1", "eth0")
    assert done.wait(5)
    assert synced == [cache.path("net", "c1", "eth0"), cache.results_dir]


def test_flush_waits_for_pending_syncs(tmp_path, monkeypatch):
    cache = ResultCache(str(tmp_path / "cache"))
    assert cache.flush(1)  # nothing pending, no thread
    gate = threading.Event()
    real_sync = cache.sync

    def slow_sync(*key, directory=True):
        gate.wait(5)
        real_sync(*key, directory=directory)

    cache.sync = slow_sync
    cache.write(CacheEntry(container_id="c1", ifname="eth0", network_name="net", config=b"{}"), durable=False)
    cache.sync_later("net", "c1", "eth0")
    assert not cache.flush(0.2)  # still syncing
    gate.set()
    assert cache.flush(5)


@pytest.mark.parametrize(
    "number, written",
    [
        (9007199254740991, b"9007199254740991"),  # the control: float64 holds it exactly
        (9007199254740993, b"9007199254740992"),
        (-9007199254740993, b"-9007199254740992"),
        (10**22 + 1, b"1e+22"),
        (True, b"true"),
    ],
)
def test_result_numbers_are_written_as_libcni_writes_them_through_a_float64(number, written):
    """libcni decodes the result into a Go map before writing it (tests/integration/cni/
    test_libcni_oracle.py checks the same against libcni itself)."""
    entry = CacheEntry(container_id="c", ifname="eth0", network_name="n", config=b"{}", result={"n": number})
    assert entry.to_json().endswith(b'"result":{"n":' + written + b"}}")


@pytest.mark.parametrize(
    "cid, ifname, net, listed",
    [
        ("c1", "eth0", "net-a", True),  # the control case: every field named
        ("", "eth0", "net-a", False),  # each of the three left empty
        ("c1", "", "net-a", False),
        ("c1", "eth0", "", False),
    ],
)
def test_entries_skip_an_entry_with_an_empty_id_ifname_or_network(tmp_path, cid, ifname, net, listed):
    """An entry no DEL could name (another writer's, or a hand-made file) is not listed: GC would
    otherwise pass it on as a valid attachment or try to DEL it. Only the JSON decides; the file
    name is a valid one in every case."""
    cache = ResultCache(str(tmp_path))
    results = tmp_path / "results"
    results.mkdir()
    entry = CacheEntry(container_id=cid, ifname=ifname, network_name=net, config=b"{}")
    (results / "net-a-c1-eth0").write_bytes(entry.to_json())
    assert [(e.container_id, e.ifname, e.network_name) for e in cache.entries()] == (
        [("c1", "eth0", "net-a")] if listed else []
    )
