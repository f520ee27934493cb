"""The intent records: written private and read back as they were; a damaged record or a half
written temp file is dropped; clearing twice is fine."""

from __future__ import annotations

import asyncio
import errno
import os
import shutil
import threading

import pytest

from nri_cni.errors import Kind, NriCniError
from nri_cni.pod.intents import IntendedNetwork, Intent, IntentStore
from nri_cni.safety import files
from nri_cni.safety.validate import InvalidInput
from tests.support.aio import emptied, on_a_loop


def test_intent_round_trip_and_damaged_records(tmp_path):
    store = IntentStore(str(tmp_path))
    intent = Intent(
        "pod1",
        "/var/run/netns/x",
        [IntendedNetwork("podnet", "eth0", b'{"name":"podnet"}', [("K8S_POD_NAME", "web")], {"a": 1})],
    )
    store.write(intent)
    assert oct(os.stat(tmp_path / "intents" / "pod1").st_mode & 0o777) == "0o600"
    (tmp_path / "intents" / "pod2").write_text("{garbage")
    (tmp_path / "intents" / "pod3.tmp").write_text("half")
    loaded = store.load_all()
    assert loaded == [intent]
    assert sorted(os.listdir(tmp_path / "intents")) == ["pod1"]
    store.clear("pod1")
    store.clear("pod1")
    assert store.load_all() == []


def test_sync_makes_a_written_record_durable_and_names_a_missing_one(tmp_path):
    store = IntentStore(str(tmp_path))
    store.write(Intent("a" * 64, "/var/run/netns/x", []), durable=False)
    asyncio.run(store.sync("a" * 64))  # the file and the directory fsynced: no error
    assert store.load("a" * 64) is not None
    # control: the same sync of a record that was never written fails, as an I/O error
    with pytest.raises(NriCniError) as err:
        asyncio.run(store.sync("b" * 64))
    assert err.value.kind is Kind.IO
    missing = tmp_path / "intents" / ("b" * 64)
    assert str(err.value) == f"cannot sync the intent record {missing}: No such file or directory"


@pytest.mark.parametrize(
    "doomed, indexes",
    [
        (["2:ctl"], {2}),  # the control case
        (["2:ctl", "10:tuning", "2:ctl"], {2, 10}),
        (["3:vendor:plugin"], {3}),  # the position is before the first colon
        (["x:ctl", ":ctl", "-1:ctl", "ctl"], set()),  # no position: nothing
        ([], set()),
    ],
)
def test_doomed_indexes(doomed, indexes):
    assert IntendedNetwork("n", "eth0", b"{}", doomed_plugins=doomed).doomed_indexes() == indexes


def test_a_record_without_the_optional_fields_reads_with_their_defaults(tmp_path):
    store = IntentStore(str(tmp_path))
    store.write(Intent("pod1", "", []))  # makes the directory
    (tmp_path / "intents" / "pod1").write_text(
        '{"podId":"pod1","networks":[{"network":"n","ifName":"eth0","config":"e30="}]}'
    )
    assert store.load("pod1") == Intent("pod1", "", [IntendedNetwork("n", "eth0", b"{}")])


@pytest.mark.parametrize(
    "doc, readable",
    [
        ('{"podId":"pod1","networks":[]}', True),  # the control case
        ('{"podId":"../pod1","networks":[]}', False),  # not a valid id
        ('{"podId":"pod1"}', False),
        # the config's base64 lacks its padding
        ('{"podId":"pod1","networks":[{"network":"n","ifName":"eth0","config":"e30"}]}', False),
        ('["pod1"]', False),
    ],
)
def test_a_damaged_record_is_removed(tmp_path, caplog, doc, readable):
    store = IntentStore(str(tmp_path))
    store.write(Intent("pod1", "", []))
    (tmp_path / "intents" / "pod1").write_text(doc)
    assert (store.load("pod1") is not None) is readable
    assert (tmp_path / "intents" / "pod1").exists() is readable
    if not readable:
        assert "is unreadable" in caplog.text


def test_a_record_naming_an_invalid_pod_id_is_removed_with_the_reason(tmp_path, caplog):
    store = IntentStore(str(tmp_path))
    store.write(Intent("pod1", "", []))
    (tmp_path / "intents" / "pod1").write_text('{"podId":"../pod1","networks":[]}')
    assert store.load("pod1") is None
    assert "is unreadable (pod id '../pod1' is not a valid id)" in caplog.text


@pytest.mark.parametrize("pod_id, valid", [("pod1", True), ("../pod1", False), ("", False)])
def test_a_record_is_named_after_a_valid_pod_id_only(tmp_path, pod_id, valid):
    store = IntentStore(str(tmp_path))
    if valid:  # the control case
        store.write(Intent(pod_id, "", []))
        assert os.listdir(tmp_path / "intents") == [pod_id]
        return
    with pytest.raises(InvalidInput, match="^pod id "):
        store.write(Intent(pod_id, "", []))
    with pytest.raises(InvalidInput, match="^pod id "):
        store.load(pod_id)


def test_pod_ids_list_records_and_no_temporary_files(tmp_path):
    store = IntentStore(str(tmp_path))
    assert store.pod_ids() == [] and store.load_all() == [] and store.load("pod1") is None
    store.write(Intent("pod2", "", []))
    store.write(Intent("pod1", "", []))
    (tmp_path / "intents" / ".pod3.1.2.tmp").write_text("half")
    assert store.pod_ids() == ["pod1", "pod2"]


def test_a_record_that_cannot_be_written_is_an_io_error(tmp_path):
    store = IntentStore(str(tmp_path))
    store.write(Intent("pod1", "", []))
    (tmp_path / "intents" / "pod1").unlink()
    (tmp_path / "intents" / "pod1").mkdir()  # a directory where the record goes: no rename over it
    with pytest.raises(NriCniError) as err:
        store.write(Intent("pod1", "", []))
    assert err.value.kind is Kind.IO
    assert str(err.value).startswith(f"cannot write the intent record {tmp_path / 'intents' / 'pod1'}: ")
    assert os.listdir(tmp_path / "intents") == ["pod1"]  # no temporary file left


def test_a_record_is_fsynced_when_written_or_else_by_sync(tmp_path, fsynced):
    store = IntentStore(str(tmp_path))
    record, directory = str(tmp_path / "intents" / "pod1"), str(tmp_path / "intents")
    store.write(Intent("pod1", "", []))  # durable, the default: the temporary file, then the directory
    assert len(fsynced) == 2 and os.path.basename(fsynced[0]).startswith(".pod1.")
    assert fsynced[1] == directory
    fsynced.clear()
    store.write(Intent("pod1", "", []), durable=False)  # the control case: no fsync yet
    assert fsynced == []
    asyncio.run(store.sync("pod1"))  # the file and the directory, at once (either first)
    assert sorted(fsynced) == sorted([record, directory])


def test_load_all_removes_a_half_written_record_and_reads_the_rest(tmp_path):
    store = IntentStore(str(tmp_path))
    store.write(Intent("pod1", "", []))
    (tmp_path / "intents" / ".pod0.1.2.tmp").write_text('{"podId":"pod0","netw')  # sorts first
    (tmp_path / "intents" / "pod2.tmp").write_text('{"podId":"pod2","networks":[]}')  # a record's name
    assert store.load_all() == [Intent("pod1", "", []), Intent("pod2", "", [])]
    assert sorted(os.listdir(tmp_path / "intents")) == ["pod1", "pod2.tmp"]


@pytest.mark.parametrize(
    "soon, loop",
    [(True, True), (False, True), (True, False)],
    ids=["daemon", "control-a-tool-on-a-loop", "control-no-loop"],
)
def test_a_record_is_cleared_at_once_and_its_file_unlinked_off_the_loop(tmp_path, monkeypatch, soon, loop):
    """The daemon's store (remove_soon) on its event loop (a pod's ADD) clears a record by a
    rename into intents-cleared/ (it is gone from intents/ at once: no load, no pod id), and its
    file is unlinked there by a worker thread later (files.remove_soon; held here until the
    directories were looked at). Controls: a tool's store, or no loop: the record is unlinked
    in the call, and no intents-cleared/ is made."""
    monkeypatch.chdir(tmp_path)
    store = IntentStore(str(tmp_path), remove_soon=True) if soon else IntentStore(str(tmp_path))
    store.write(Intent("pod1", "", []))
    unlinked: list[tuple[str, bool]] = []
    looked = threading.Event()
    real = files._unlink_logged

    def spy(path: str) -> None:
        unlinked.append((os.path.basename(path), on_a_loop()))
        looked.wait()
        real(path)

    monkeypatch.setattr(files, "_unlink_logged", spy)

    async def clear() -> list[str]:
        store.clear("pod1")
        assert os.listdir(tmp_path / "intents") == []
        left = os.listdir(tmp_path / "intents-cleared") if soon else []
        assert store.load("pod1") is None and store.pod_ids() == []
        looked.set()
        await asyncio.wait_for(emptied(tmp_path / "intents-cleared"), 60)
        return left

    if loop:
        left = asyncio.run(clear())
    else:
        looked.set()  # never waited for: nothing runs on a worker
        store.clear("pod1")
        left = []
        assert store.load("pod1") is None and store.pod_ids() == []
    if soon and loop:
        assert len(left) == 1 and left[0].startswith("pod1.")
        assert unlinked == [(left[0], False)]
        assert os.listdir(tmp_path / "intents-cleared") == []
    else:
        assert unlinked == [] and not (tmp_path / "intents-cleared").exists()
        assert os.listdir(os.getcwd()) == ["intents"]  # no trash anywhere (cwd: tmp_path)
    assert os.listdir(tmp_path / "intents") == []
    store.clear("pod1")  # nothing left to clear: no error, nothing unlinked
    assert len(unlinked) == (1 if soon and loop else 0)


def test_a_record_cleared_but_not_yet_unlinked_is_no_record_at_start_up(tmp_path):
    """A kill between the clear's rename and its unlink leaves the file in intents-cleared/:
    start-up (load_all) removes it, rolls nothing back. Control: a record in intents/ is read."""
    store = IntentStore(str(tmp_path))
    store.write(Intent("pod1", "", []))
    store.write(Intent("pod2", "", []))
    (tmp_path / "intents-cleared").mkdir()
    os.rename(tmp_path / "intents" / "pod1", tmp_path / "intents-cleared" / "pod1.999.1")
    assert store.load_all() == [Intent("pod2", "", [])]
    assert os.listdir(tmp_path / "intents") == ["pod2"] and os.listdir(tmp_path / "intents-cleared") == []


def test_the_directory_is_made_private_by_the_first_record_and_again_when_removed(tmp_path, monkeypatch):
    """The first write makes the directory 0700 (one found writable by others is fixed); later
    writes do not look at it (no private_dir call); one removed meanwhile is made again by the
    next write. Control: the directory's mode before the first write."""
    made = []
    real = files.private_dir
    monkeypatch.setattr(files, "private_dir", lambda d: made.append(d) or real(d))
    directory = tmp_path / "intents"
    directory.mkdir()
    directory.chmod(0o777)
    assert directory.stat().st_mode & 0o777 == 0o777
    store = IntentStore(str(tmp_path))
    store.write(Intent("pod1", "", []), durable=False)
    assert directory.stat().st_mode & 0o777 == 0o700 and made == [str(directory)]
    made.clear()
    store.write(Intent("pod2", "", []), durable=False)
    assert made == []
    shutil.rmtree(directory)
    store.write(Intent("pod3", "", []), durable=False)
    assert made == [str(directory)] and directory.stat().st_mode & 0o777 == 0o700
    assert store.pod_ids() == ["pod3"]


def test_after_start_up_only_the_records_the_store_holds_are_looked_at(tmp_path, monkeypatch):
    """load_all() (start-up) learns which pods have a record; then load() of any other pod is
    None without opening a file, while the records found at start-up and those written since
    are read, and a cleared or damaged one is not looked at again; a listing (GC's) holds what
    it finds, a record put there from outside included. Control: before load_all(),
    every load() looks (a tool's store, or the daemon before its start-up)."""
    store = IntentStore(str(tmp_path))
    store.write(Intent("found", "", []))
    store.write(Intent("damaged", "", []))
    (tmp_path / "intents" / "damaged").write_text("{")
    looked: list[str] = []
    read = IntentStore._read
    monkeypatch.setattr(
        IntentStore, "_read", staticmethod(lambda p: looked.append(os.path.basename(p)) or read(p))
    )
    fresh = IntentStore(str(tmp_path))
    assert fresh.load("nobody") is None and looked == ["nobody"]  # the control: no listing yet
    looked.clear()
    assert [i.pod_id for i in fresh.load_all()] == ["found"]
    # a record put there from outside after start-up: not seen until a listing finds it
    (tmp_path / "intents" / "outside").write_bytes(b'{"podId": "outside", "networks": []}')
    looked.clear()
    assert fresh.load("outside") is None and fresh.load("damaged") is None and looked == []
    assert fresh.load("found") is not None and looked == ["found"]
    assert fresh.pod_ids() == ["found", "outside"]  # a listing (GC's) holds what it finds
    assert fresh.load("outside") is not None and looked == ["found", "outside"]
    (tmp_path / "intents" / "outside").unlink()
    fresh.write(Intent("new", "", []))
    assert fresh.load("new") is not None and looked == ["found", "outside", "new"]
    fresh.clear("new")
    fresh.clear("found")
    fresh.write(Intent("vanished", "", []))
    (tmp_path / "intents" / "vanished").unlink()  # from outside: its clear finds nothing
    fresh.clear("vanished")
    looked.clear()
    assert fresh.load("new") is None and fresh.load("found") is None and fresh.load("vanished") is None
    assert fresh.load("outside") is None and looked == ["outside"]  # removed from outside: one look
    assert fresh.load("outside") is None and looked == ["outside"]  # then no more
    looked.clear()
    fresh.write(Intent("broken", "", []))
    (tmp_path / "intents" / "broken").write_text("{")
    assert fresh.load("broken") is None and fresh.load("broken") is None  # removed at the first look
    assert looked == ["broken"] and not (tmp_path / "intents" / "broken").exists()


class _Made:
    """files.Unnamed spied on: each file made ahead, and the errno to fail with."""

    def __init__(self, monkeypatch, fail: int = 0) -> None:
        self.files: list[files.Unnamed] = []
        self.attempts = 0
        real = files.Unnamed
        spy = self

        class Spied(real):
            def __init__(self, directory: str) -> None:
                spy.attempts += 1
                if fail:
                    raise OSError(fail, os.strerror(fail))
                super().__init__(directory)
                spy.files.append(self)

        monkeypatch.setattr(files, "Unnamed", Spied)


def _created(monkeypatch) -> list[str]:
    """The records created the usual way (files.atomic_in), by name."""
    names: list[str] = []
    real = files.atomic_in
    monkeypatch.setattr(
        files, "atomic_in", lambda path, *dirs: names.append(os.path.basename(path)) or real(path, *dirs)
    )
    return names


async def _landed(store: IntentStore) -> None:
    """Until the worker making the next record's file is done (its callback ran on the loop)."""
    while store._making:
        await asyncio.sleep(0)


def _everything(tmp_path) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, f), tmp_path) for d, _, fs in os.walk(tmp_path) for f in fs)


@pytest.mark.parametrize("loop", [True, False], ids=["on-the-loop", "control-no-loop"])
def test_a_new_record_is_written_into_a_file_made_ahead_on_the_loop(tmp_path, monkeypatch, fsynced, loop):
    """The daemon's way: the first record is created as it is written (none made yet) and the
    next one's file is made on a worker thread; the next new record is that file, given its
    name (not fsynced: its sync() does that), and another is made ahead, one at a time.
    Nothing but the records shows in the state directory. Control: without a loop (a tool)
    every record is created as written, none made ahead."""
    made, created = _Made(monkeypatch), _created(monkeypatch)
    store = IntentStore(str(tmp_path))
    second = Intent("pod2", "/run/netns/x", [IntendedNetwork("n", "eth0", b"{}")])

    async def writes() -> None:
        store.write(Intent("pod1", "", []), durable=False)  # an ADD's: made durable by sync()
        assert made.attempts == 0  # not beside the write: the plugin's spawn comes next
        await store.sync("pod1")
        await _landed(store)
        await store.sync("pod1")  # one made ahead already: no other
        await _landed(store)
        assert made.attempts == 1 and _everything(tmp_path) == ["intents/pod1"]
        fsynced.clear()
        store.write(second, durable=False)
        assert fsynced == []
        await store.sync("pod2")
        await _landed(store)

    if loop:
        asyncio.run(writes())
        assert created == ["pod1"] and made.attempts == 2
        assert made.files[0].fd == -1  # published: its descriptor let go
        os.fstat(made.files[1].fd)  # the next one's, open
    else:
        store.write(Intent("pod1", "", []), durable=False)
        store.write(second, durable=False)
        assert created == ["pod1", "pod2"] and made.attempts == 0 and fsynced == []
    assert store.load("pod2") == second and store.pod_ids() == ["pod1", "pod2"]
    assert _everything(tmp_path) == ["intents/pod1", "intents/pod2"]
    assert oct(os.stat(tmp_path / "intents" / "pod2").st_mode & 0o777) == "0o600"
    store.close()


def test_a_record_rewritten_replaces_the_old_one_the_usual_way(tmp_path, monkeypatch):
    """A rollback rewrites its pod's record: the file made ahead cannot take a name that exists,
    so the record is created and renamed over the old one, and another file is made ahead.
    Control: a new record, next, is written into that file."""
    made, created = _Made(monkeypatch), _created(monkeypatch)
    store = IntentStore(str(tmp_path))
    rewritten = Intent("pod1", "", [], rollback_error="DEL failed")

    async def writes() -> None:
        store.write(Intent("pod1", "", []))  # durable at once (a rollback's way)
        await _landed(store)
        store.write(rewritten)
        await _landed(store)
        store.write(Intent("pod2", "", []))
        await _landed(store)

    asyncio.run(writes())
    assert store.load("pod1") == rewritten and store.load("pod2") == Intent("pod2", "", [])
    assert created == ["pod1", "pod1"] and made.attempts == 3
    assert [f.fd for f in made.files[:2]] == [-1, -1]  # the one refused is let go too
    assert _everything(tmp_path) == ["intents/pod1", "intents/pod2"]
    store.close()


@pytest.mark.parametrize(
    "fail, attempts",
    [(errno.EOPNOTSUPP, 1), (errno.EISDIR, 1), (errno.EMFILE, 3)],
    ids=["no-O_TMPFILE", "old-kernel", "control-out-of-descriptors-tries-again"],
)
def test_a_file_system_without_files_made_ahead_is_not_asked_again(tmp_path, monkeypatch, fail, attempts):
    """Where the file system has no O_TMPFILE every record is created as it is written and no
    worker tries again; any other failure is tried again at the next record."""
    made, created = _Made(monkeypatch, fail=fail), _created(monkeypatch)
    store = IntentStore(str(tmp_path))

    async def writes() -> None:
        for pod in ("pod1", "pod2", "pod3"):
            store.write(Intent(pod, "", []), durable=False)
            await store.sync(pod)
            await _landed(store)

    asyncio.run(writes())
    assert made.attempts == attempts and created == ["pod1", "pod2", "pod3"]
    assert store.pod_ids() == ["pod1", "pod2", "pod3"]


@pytest.mark.parametrize("landed", [True, False], ids=["made-before-close", "landing-after-close"])
def test_close_lets_the_file_made_ahead_go_and_makes_none_after(tmp_path, monkeypatch, landed):
    made = _Made(monkeypatch)
    store = IntentStore(str(tmp_path), remove_soon=True)

    async def main() -> None:
        store.write(Intent("pod1", "", []))
        if landed:
            await _landed(store)
        store.clear("pod1")  # its unlink is due in UNLINK_AFTER: close() does it now
        assert len(os.listdir(tmp_path / "intents-cleared")) == 1
        store.close()
        assert os.listdir(tmp_path / "intents-cleared") == []
        await _landed(store)
        store.write(Intent("pod2", "", []))  # the usual way: nothing made ahead
        await _landed(store)

    asyncio.run(main())
    assert made.attempts == 1 and made.files[0].fd == -1
    assert _everything(tmp_path) == ["intents/pod2"]
