"""The intent records: written private and read back as they were; a damaged record or a half
written temp file is dropped; clearing twice is fine."""

from __future__ import annotations

import os

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
