"""libcni's cache format, byte for byte, and the tolerant / atomic file handling."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import stat
import threading
from pathlib import Path

import pytest

from nri_cni.cni.cache import CacheEntry, CorruptEntry, ResultCache
from nri_cni.errors import CniCode, CNIError, ConfigError
from tests.support.aio import emptied
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
    got = cache.read("nct-golden", "c0ffee", "eth0")
    assert got is not None and got.netns == "/var/run/netns/other"
    assert got.path == str(tmp_path / "results" / "nct-golden-c0ffee-eth0")  # where it was read from


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
        path = os.readlink(f"/proc/self/fd/{fd}")
        real_fsync(fd)
        if not path.startswith(f"{tmp_path}/"):
            return  # another test's syncer thread, still at work
        synced.append(path)
        if os.path.isdir(path):
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
        (2**60 + 1, b"1152921504606847000"),  # the float64 2**60, in its shortest digits
        (-(2**60) - 1, b"-1152921504606847000"),
        (10**21 - 2**17, b"999999999999999900000"),  # the last float64 below 1e21: still digits
        (10**21, b"1e+21"),  # from 1e21 on, Go's exponent form
        (-(10**21), b"-1e+21"),
        (10**22 + 1, b"1e+22"),
        (True, b"true"),  # a bool stays a bool (not the number 1)
    ],
)
def test_result_numbers_are_written_as_libcni_writes_them_through_a_float64(number, written):
    """libcni decodes the result into a Go map before writing it (tests/integration/cni/
    test_libcni_oracle.py checks the same against libcni itself)."""
    entry = CacheEntry(container_id="c", ifname="eth0", network_name="n", config=b"{}", result={"n": number})
    assert entry.to_json().endswith(b'"result":{"n":' + written + b"}}")
    nested = CacheEntry(
        container_id="c", ifname="eth0", network_name="n", config=b"{}", result={"r": [{"n": number}]}
    )
    assert nested.to_json().endswith(b'"result":{"r":[{"n":' + written + b"}]}}")  # in lists and objects too


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
    name is a valid one in every case. A valid entry in a file that sorts after it is listed all the
    same (the skip goes on to the next file)."""
    cache = ResultCache(str(tmp_path))
    results = tmp_path / "results"
    results.mkdir()
    entry = CacheEntry(container_id=cid, ifname=ifname, network_name=net, config=b"{}")
    (results / "net-a-c1-eth0").write_bytes(entry.to_json())
    after = CacheEntry(container_id="c2", ifname="eth0", network_name="net-b", config=b"{}")
    (results / "net-b-c2-eth0").write_bytes(after.to_json())
    assert [(e.container_id, e.ifname, e.network_name) for e in cache.entries()] == (
        [("c1", "eth0", "net-a")] if listed else []
    ) + [("c2", "eth0", "net-b")]


@pytest.mark.parametrize(
    "text, written",
    [
        ("a/b", '"a/b"'),  # the control case: nothing Go escapes
        ("a<b", '"a\\u003cb"'),
        ("a>b", '"a\\u003eb"'),
        ("a&b", '"a\\u0026b"'),
        ("a\u2028b", '"a\\u2028b"'),
        ("a\u2029b", '"a\\u2029b"'),
        ("\u00e9", '"\u00e9"'),  # other non-ASCII stays UTF-8, as Go writes it
    ],
)
def test_strings_are_escaped_as_go_escapes_them(text, written):
    entry = CacheEntry(container_id="c", ifname="eth0", network_name="n", config=b"{}", netns=text)
    assert f',"netns":{written}}}'.encode() in entry.to_json()


BARE = b'{"kind":"cniCacheV1"'


@pytest.mark.parametrize(
    "content, reason",
    [
        (b"", "empty file"),
        (b" \n", "empty file"),
        (b"{trunc", "not JSON: "),
        (b"[]", "not a JSON object"),
        (b'{"kind":"other"}', "kind is 'other', not 'cniCacheV1'"),
        (b"{}", "kind is None, not 'cniCacheV1'"),
        (BARE + b',"containerId":1}', "containerid is not a string"),
        (BARE + b',"ifName":[]}', "ifname is not a string"),
        (BARE + b',"config":"***"}', "config is not base64"),
        (BARE + b',"cniArgs":"a=b"}', "cniArgs is not a list of [key, value] pairs"),
        (BARE + b',"cniArgs":["ab"]}', "cniArgs is not a list of [key, value] pairs"),
        (BARE + b',"cniArgs":[["a"]]}', "cniArgs is not a list of [key, value] pairs"),
        (BARE + b',"cniArgs":[["a","b","c"]]}', "cniArgs is not a list of [key, value] pairs"),
        (BARE + b',"cniArgs":[["a",1]]}', "cniArgs is not a list of [key, value] pairs"),
        (BARE + b',"capabilityArgs":[1]}', "capabilityArgs or result is not an object"),
        (BARE + b',"result":[{}]}', "capabilityArgs or result is not an object"),
    ],
)
def test_corrupt_entry_reasons(content, reason):
    """Each way a file is not a cniCacheV1 object, and the reason the warning gives for it."""
    with pytest.raises(CorruptEntry) as err:
        CacheEntry.from_json(content)
    assert str(err.value).startswith(reason) and (reason.endswith(": ") or str(err.value) == reason)


@pytest.mark.parametrize(
    "content",
    [
        BARE + b"}",  # the control case of the table above: only the kind
        BARE + b',"containerId":null,"ifName":null,"networkName":null,"netns":null,"config":null}',
        BARE + b',"cniArgs":null,"capabilityArgs":null,"result":null}',
        BARE + b',"cniArgs":[],"capabilityArgs":{},"result":{}}',
    ],
)
def test_absent_null_and_empty_fields_read_as_empty(content):
    """As Go decodes them into cachedInfo's zero values (an empty result is no result)."""
    entry = CacheEntry.from_json(content)
    assert entry == CacheEntry(container_id="", ifname="", network_name="", config=b"")
    assert entry.result is None and entry.cni_args == [] and entry.capability_args == {}


@pytest.mark.parametrize(
    "parts, nameable",
    [
        (("n", "c", "eth0"), True),  # the control case
        (("", "c", "eth0"), False),
        (("n", "", "eth0"), False),
        (("n", "c", ""), False),
        (("n/x", "c", "eth0"), False),
        (("n", "c/x", "eth0"), False),
        (("n", "c", "eth/0"), False),
        (("n\0x", "c", "eth0"), False),
        (("n", "c\0x", "eth0"), False),
        (("n", "c", "eth\0"), False),
    ],
)
def test_only_single_path_components_name_an_entry(tmp_path, parts, nameable):
    """read() and delete() of an entry no file can be named after find nothing, without raising."""
    cache = ResultCache(str(tmp_path))
    if nameable:
        assert cache.path(*parts) == str(tmp_path / "results" / "-".join(parts))
    else:
        with pytest.raises(ConfigError, match="cannot name a cache file after") as err:
            cache.path(*parts)
        assert err.value.location == cache.results_dir
    assert cache.read(*parts) is None
    cache.delete(*parts)


def test_an_unreadable_entry_reads_as_none_and_is_warned_about(tmp_path, caplog):
    cache = ResultCache(str(tmp_path))
    os.makedirs(cache.path("n", "c", "eth0"))  # a directory where the file should be
    with caplog.at_level(logging.WARNING):
        assert cache.read("n", "c", "eth0") is None
    assert "cannot read CNI cache file" in caplog.text


def test_count_is_of_the_entry_files_by_name(tmp_path):
    """Every regular file but our temporary ones, opened or not (a corrupt one counts)."""
    cache = ResultCache(str(tmp_path))
    assert cache.count() == 0  # no results directory yet
    cache.write(CacheEntry(container_id="c1", ifname="eth0", network_name="n", config=b"{}"))
    assert cache.count() == 1  # the control case for each file below
    results = tmp_path / "results"
    (results / "n-c2-eth0").write_text("{corrupt")
    (results / ".n-c3-eth0.1.2.tmp").write_text("")
    (results / "n-c4-eth0").mkdir()
    (results / "n-c5-eth0").symlink_to(results / "n-c1-eth0")
    assert cache.count() == 2
    (tmp_path / "file").write_text("")
    assert ResultCache(str(tmp_path / "file")).count() == 0  # no directory to list


def test_entries_for_a_container_whose_network_name_is_one_character(tmp_path):
    cache = ResultCache(str(tmp_path))
    cache.write(CacheEntry(container_id="c1", ifname="eth0", network_name="n", config=b"{}"))
    assert [e.network_name for e in cache.entries(container_id="c1")] == ["n"]


def test_prepare_twice_makes_one_temporary_file(tmp_path):
    cache = ResultCache(str(tmp_path))
    w = cache.prepare(CacheEntry(container_id="c1", ifname="eth0", network_name="n", config=b"{}"))
    w.prepare()
    w.prepare()
    assert len(os.listdir(cache.results_dir)) == 1
    w.commit(None)
    assert os.listdir(cache.results_dir) == ["n-c1-eth0"]
    with pytest.raises(RuntimeError, match="^cache write already committed or discarded$"):
        w.commit(None)


def test_prepare_of_an_impossible_name_leaves_the_error_to_commit(tmp_path):
    cache = ResultCache(str(tmp_path))
    w = cache.prepare(CacheEntry(container_id="c/1", ifname="eth0", network_name="n", config=b"{}"))
    w.prepare()  # best effort: no error here
    with pytest.raises(ConfigError):
        w.commit(None)


def test_a_failed_write_is_an_io_failure_naming_the_file(tmp_path):
    """The results directory is a file: no temporary file can be made (nor synced, nor listed)."""
    cache = ResultCache(str(tmp_path))
    (tmp_path / "results").write_text("")
    path = cache.path("n", "c1", "eth0")
    with pytest.raises(CNIError) as err:
        cache.write(CacheEntry(container_id="c1", ifname="eth0", network_name="n", config=b"{}"))
    assert (err.value.cni_code, err.value.msg, err.value.details) == (
        CniCode.IO_FAILURE,
        f"cannot write CNI cache file {path}",
        "Not a directory",
    )
    with pytest.raises(CNIError) as err:
        cache.sync("n", "c1", "eth0")
    assert (err.value.cni_code, err.value.msg, err.value.details) == (
        CniCode.IO_FAILURE,
        f"cannot sync CNI cache file {path}",
        "Not a directory",
    )


@pytest.mark.parametrize("durable", [True, False])
def test_a_write_is_fsynced_file_then_directory_unless_told_not_to(tmp_path, fsynced, durable):
    cache = ResultCache(str(tmp_path))
    entry = CacheEntry(container_id="c1", ifname="eth0", network_name="n", config=b"{}")
    if durable:
        cache.write(entry)  # the default
        (tmp,) = fsynced[:1]
        assert os.path.basename(tmp).startswith(".n-c1-eth0.") and fsynced[1:] == [cache.results_dir]
    else:
        cache.write(entry, durable=False)
        assert fsynced == []


@pytest.mark.parametrize("directory", [True, False])
def test_sync_fsyncs_the_file_and_its_directory_unless_told_not_to(tmp_path, fsynced, directory):
    cache = ResultCache(str(tmp_path))
    cache.write(CacheEntry(container_id="c1", ifname="eth0", network_name="n", config=b"{}"), durable=False)
    if directory:
        cache.sync("n", "c1", "eth0")  # the default
    else:
        cache.sync("n", "c1", "eth0", directory=False)
    assert fsynced == [cache.path("n", "c1", "eth0")] + ([cache.results_dir] if directory else [])


@pytest.mark.parametrize(
    "name, listed",
    [
        ("n-c1-eth0", True),  # the control case: <network>-<id>-<ifname>
        ("-c1-eth0", False),  # nothing before "-c1-"
        ("n-c1-", False),  # nothing after it
        ("n-c1-c1-", True),  # the first "-c1-" decides (strings.Index): something after it
        ("-c1-c1-eth0", False),  # the first "-c1-" has nothing before it
    ],
)
def test_entries_of_a_container_read_only_files_named_as_libcni_names_them(tmp_path, name, listed):
    """libcni's GetCachedAttachments: asked for one container, it reads only the files whose name
    holds "-<id>-" with something before and after it. Every file here holds the same valid
    entry of c1, which entries() without an id lists whatever the name."""
    cache = ResultCache(str(tmp_path))
    (tmp_path / "results").mkdir()
    entry = CacheEntry(container_id="c1", ifname="eth0", network_name="n", config=b"{}")
    (tmp_path / "results" / name).write_bytes(entry.to_json())
    assert len(cache.entries()) == 1
    assert len(cache.entries(container_id="c1")) == (1 if listed else 0)


@pytest.mark.parametrize("network_bytes, nameable", [(248, True), (249, False)])
def test_an_entry_name_is_at_most_255_bytes(tmp_path, network_bytes, nameable):
    """<network>-<id>-<ifname> is one file name: 255 bytes at most (here 248 + 7 is the control
    case), though each part is a valid name on its own."""
    cache = ResultCache(str(tmp_path))
    parts = ("n" * network_bytes, "c", "eth0")
    if nameable:
        assert cache.path(*parts) == str(tmp_path / "results" / "-".join(parts))
    else:
        with pytest.raises(ConfigError, match="is not a safe file name") as err:
            cache.path(*parts)
        assert err.value.location == cache.results_dir
    assert cache.read(*parts) is None
    cache.delete(*parts)


@pytest.mark.parametrize(
    "failing, error, details",
    [
        (None, None, None),  # the control case: both fsyncs succeed
        ("file", OSError(errno.EIO, os.strerror(errno.EIO)), "Input/output error"),
        ("directory", OSError(errno.EIO, os.strerror(errno.EIO)), "Input/output error"),
        ("file", OSError("no errno"), "no errno"),  # no strerror: the error's text
    ],
)
def test_a_failed_fsync_is_an_io_failure_naming_the_file(tmp_path, monkeypatch, failing, error, details):
    cache = ResultCache(str(tmp_path))
    cache.write(CacheEntry(container_id="c1", ifname="eth0", network_name="n", config=b"{}"), durable=False)
    path = cache.path("n", "c1", "eth0")
    target = {None: None, "file": path, "directory": cache.results_dir}[failing]
    real_fsync = os.fsync

    def fsync(fd):
        if os.readlink(f"/proc/self/fd/{fd}") == target:
            raise error
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    if failing is None:
        cache.sync("n", "c1", "eth0")
        return
    with pytest.raises(CNIError) as err:
        cache.sync("n", "c1", "eth0")
    assert (err.value.cni_code, err.value.msg, err.value.details) == (
        CniCode.IO_FAILURE,
        f"cannot sync CNI cache file {path}",
        details,
    )


@pytest.mark.parametrize("blocked", [False, True])
def test_a_prepare_that_failed_is_done_again_by_commit(tmp_path, blocked):
    """prepare() is best effort: here the results directory is a file while it runs (blocked) and
    gone when commit() runs, which writes the entry all the same. The control: nothing in the way,
    prepare() makes the temporary file that commit() renames."""
    cache = ResultCache(str(tmp_path))
    entry = CacheEntry(container_id="c1", ifname="eth0", network_name="n", config=b"{}")
    results = tmp_path / "results"
    if blocked:
        results.write_text("")
    w = cache.prepare(entry)
    w.prepare()
    if blocked:
        results.unlink()
    else:
        assert len(os.listdir(results)) == 1
    w.commit(None, durable=False)
    assert os.listdir(results) == ["n-c1-eth0"]
    assert (results / "n-c1-eth0").read_bytes() == entry.to_json()


SYNC_THREAD = "nri-cni-cache-sync"


def test_the_sync_thread_is_a_daemon_named_for_thread_dumps(tmp_path):
    """It never holds the process up at exit (a process that must wait calls flush()); its name
    tells it apart in a dump of the daemon's threads. The control: no thread before the first
    sync_later()."""

    def ours() -> set[threading.Thread]:
        return {t for t in threading.enumerate() if t.name == SYNC_THREAD}

    before = ours()
    cache = ResultCache(str(tmp_path))
    cache.write(CacheEntry(container_id="c1", ifname="eth0", network_name="n", config=b"{}"), durable=False)
    assert ours() == before
    cache.sync_later("n", "c1", "eth0")
    (thread,) = ours() - before
    assert thread.daemon


def test_entries_queued_while_a_sync_runs_share_one_directory_fsync(tmp_path, monkeypatch):
    """c2 and c3 are queued while the thread is in c1's fsync: it then syncs both and the
    directory once (c1 alone, the control, had its own directory fsync)."""
    cache = ResultCache(str(tmp_path))
    for cid in ("c1", "c2", "c3"):
        cache.write(
            CacheEntry(container_id=cid, ifname="eth0", network_name="n", config=b"{}"), durable=False
        )
    synced: list[str] = []
    inside, release = threading.Event(), threading.Event()
    real_fsync = os.fsync

    def fsync(fd):
        path = os.readlink(f"/proc/self/fd/{fd}")
        if path.startswith(f"{tmp_path}/"):
            synced.append(path)
            if len(synced) == 1:
                inside.set()
                release.wait()
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    try:
        cache.sync_later("n", "c1", "eth0")
        assert inside.wait(60)
        cache.sync_later("n", "c2", "eth0")
        cache.sync_later("n", "c3", "eth0")
    finally:
        release.set()
    assert cache.flush(60)
    c1, c2, c3 = (cache.path("n", cid, "eth0") for cid in ("c1", "c2", "c3"))
    assert synced == [c1, cache.results_dir, c2, c3, cache.results_dir]


@pytest.mark.parametrize(
    "netns, readable", [("/run/netns/\u00e9".encode(), True), (b"/run/netns/\xff", False)]
)
def test_an_entry_whose_bytes_are_not_utf8_is_corrupt(tmp_path, caplog, netns, readable):
    """read() finds it corrupt and entries() skips it, neither raises (libcni reads such bytes as
    U+FFFD: tests/integration/cni/test_libcni_oracle.py pins where nri-cni differs). The control:
    the same entry with valid UTF-8."""
    cache = ResultCache(str(tmp_path))
    (tmp_path / "results").mkdir()
    data = BARE + b',"containerId":"c1","ifName":"eth0","networkName":"n","netns":"' + netns + b'"}'
    (tmp_path / "results" / "n-c1-eth0").write_bytes(data)
    with caplog.at_level(logging.WARNING):
        entry = cache.read("n", "c1", "eth0")
    assert [e.netns for e in cache.entries()] == ([netns.decode()] if readable else [])
    if readable:
        assert entry is not None and entry.netns == "/run/netns/\u00e9"
    else:
        assert entry is None and "corrupt" in caplog.text


@pytest.mark.parametrize("durable", [None, False])
def test_a_prepared_write_is_durable_unless_told_not_to(tmp_path, fsynced, durable):
    """commit() without durable= (CNIRuntime's durable cache) fsyncs the file, then the directory;
    durable=False (the control) leaves both to sync()."""
    cache = ResultCache(str(tmp_path))
    w = cache.prepare(CacheEntry(container_id="c1", ifname="eth0", network_name="n", config=b"{}"))
    w.prepare()
    if durable is None:
        w.commit(None)
        (tmp,) = fsynced[:1]
        assert os.path.basename(tmp).startswith(".n-c1-eth0.") and fsynced[1:] == [cache.results_dir]
    else:
        w.commit(None, durable=durable)
        assert fsynced == []


def test_flush_waits_ten_seconds_unless_told(tmp_path, monkeypatch):
    """How long the daemon's and cnitool's exit wait at most for pending syncs (flush())."""
    cache = ResultCache(str(tmp_path))
    cache.write(CacheEntry(container_id="c1", ifname="eth0", network_name="n", config=b"{}"), durable=False)
    cache.sync_later("n", "c1", "eth0")
    bounds: list[float] = []
    monkeypatch.setattr(cache._syncer, "flush", lambda timeout: bounds.append(timeout) or True)
    assert cache.flush() and cache.flush(0.5)
    assert bounds == [10.0, 0.5]


@pytest.mark.parametrize("skipped", ["none", "part-first", "part-last", "empty-ifname"])
def test_a_skipped_file_does_not_end_the_listing(tmp_path, skipped):
    """Files the listing skips (the container's part at the very start or end of the name,
    an entry without its ifname) sort before the container's real entry: the entries after
    them are still listed. Control: no such file."""
    cache = ResultCache(str(tmp_path))
    cache.write(CacheEntry(container_id="c1", ifname="eth0", network_name="net-a", config=b"{}"))
    results = tmp_path / "results"
    odd = CacheEntry(container_id="c1", ifname="eth0", network_name="net-0", config=b"{}").to_json()
    if skipped == "part-first":
        (results / "-c1-eth0").write_bytes(odd)
    elif skipped == "part-last":
        (results / "a-c1-").write_bytes(odd)
    elif skipped == "empty-ifname":
        (results / "a-c1-eth9").write_bytes(
            CacheEntry(container_id="c1", ifname="", network_name="a", config=b"{}").to_json()
        )
    assert [(e.network_name, e.container_id) for e in cache.entries(container_id="c1")] == [("net-a", "c1")]


def test_a_missing_cache_dir_is_made_private_with_its_results_dir(tmp_path):
    """The cache dir and its results dir, neither there yet, are both made 0700 by the first
    write whatever the umask (a node's 022). Control: the golden write above checks results."""
    old = os.umask(0o022)
    try:
        ResultCache(str(tmp_path / "cache")).write(
            CacheEntry(container_id="c1", ifname="eth0", network_name="n", config=b"{}")
        )
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "cache").stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "cache" / "results").stat().st_mode) == 0o700


@pytest.mark.parametrize(
    "soon, loop",
    [(True, True), (False, True), (True, False)],
    ids=["daemon", "control-a-tool-on-a-loop", "control-no-loop"],
)
def test_a_deleted_entry_leaves_results_at_once_and_its_trash_empties(
    tmp_path, monkeypatch, soon, loop, caplog
):
    """The daemon's cache (remove_soon) on its event loop renames a deleted entry into
    results-deleted/ and has it unlinked there later, off the loop: results/ lists nothing the
    moment delete() returns. A tool's cache (its loop ends with its call; the cache dir may be
    libcni's), or no loop, unlinks it in the call and makes no results-deleted/. A file that
    cannot leave is warned about, and stays."""
    monkeypatch.chdir(tmp_path)
    cache = ResultCache(str(tmp_path), remove_soon=True) if soon else ResultCache(str(tmp_path))
    assert cache.deleted_dir == str(tmp_path / "results-deleted")  # docs/reliability.md, the leak checker
    cache.write(golden_entry())

    async def delete() -> list[str]:
        cache.delete("nct-golden", "c0ffee", "eth0")
        listed = os.listdir(cache.results_dir)
        if soon:
            assert len(os.listdir(cache.deleted_dir)) == 1
        await asyncio.wait_for(emptied(cache.deleted_dir), 60)
        return listed

    if loop:
        assert asyncio.run(delete()) == []
    else:
        cache.delete("nct-golden", "c0ffee", "eth0")
    assert os.path.exists(cache.deleted_dir) == (soon and loop)
    assert sorted(os.listdir(os.getcwd())) == ["results", "results-deleted"][: 2 if soon and loop else 1]
    if soon and loop:
        assert os.listdir(cache.deleted_dir) == []
    assert os.listdir(cache.results_dir) == [] and cache.read("nct-golden", "c0ffee", "eth0") is None
    os.makedirs(cache.path("nct-golden", "c0ffee", "eth0"))  # a directory where the entry was
    with caplog.at_level(logging.WARNING):
        cache.delete("nct-golden", "c0ffee", "eth0")
    assert "cannot remove CNI cache file" in caplog.text
    assert os.listdir(cache.results_dir) == ["nct-golden-c0ffee-eth0"]


def test_close_unlinks_the_deleted_entries_still_due_and_leaves_the_entries_alone(tmp_path):
    """The daemon's stop: what waits in results-deleted/ for its unlink goes; the control, a
    live entry in results/, stays. A cache that never deleted anything closes too."""
    cache = ResultCache(str(tmp_path), remove_soon=True)
    cache.close()  # no results-deleted/ yet
    cache.write(golden_entry())
    os.makedirs(cache.deleted_dir)
    Path(cache.deleted_dir, "nct-golden-0ddba11-eth0.1.0").write_bytes(b"{}")
    cache.close()
    assert os.listdir(cache.deleted_dir) == []
    assert os.listdir(cache.results_dir) == ["nct-golden-c0ffee-eth0"]
