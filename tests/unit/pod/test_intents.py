"""The intent records: written private and read back as they were; a damaged record or a half
written temp file is dropped; clearing twice is fine."""

from __future__ import annotations

import asyncio
import os

import pytest

from nri_cni.errors import Kind, NriCniError
from nri_cni.pod.intents import IntendedNetwork, Intent, IntentStore


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
