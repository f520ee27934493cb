"""Hot reload without a daemon: ConfigReloader with a recording `apply`, inotify and the rescan,
refusals with locations, drop-in plugin directories (libcni 1.3) and `_finalize.d`."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from pathlib import Path

import pytest
import yaml

from nri_cni.daemon.inotify import DirWatcher
from nri_cni.daemon.reload import RESTART_ONLY, ConfigReloader, watched_dirs
from nri_cni.lifecycle import generation_id
from tests.support.reloading import Applied, base_config, inline, refusal, start, write


def rounds_from_now(reloader) -> list[bool]:
    """What each reload round that starts from now on returns (True: a change applied), as it
    ends: the event after which a change would have been applied."""
    done: list[bool] = []
    reload_now = reloader.reload_now

    async def recording(reason: str) -> bool:
        changed = await reload_now(reason)
        done.append(changed)
        return changed

    reloader.reload_now = recording
    return done


async def until_true(predicate, timeout: float = 60.0) -> None:
    """Waits for an event the test caused; the deadline only fails a hang."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "the event did not come"
        await asyncio.sleep(0.01)


def test_a_rewritten_config_is_seen_by_inotify_and_applied(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(base_config(tmp_path, [inline("one", default=True)])))

    async def scenario():
        reloader, applied = start(path)
        await reloader.start()
        assert reloader.report()["inotify"] is True
        write(path, yaml.safe_dump(base_config(tmp_path, [inline("one", default=True), inline("two")])))
        cfg = await applied.next()
        assert [n.name for n in cfg.networks] == ["one", "two"]
        assert reloader.cfg is cfg and reloader.report()["applied"] == 1
        # touching the file without changing it applies nothing: a round that read it ends
        done = rounds_from_now(reloader)
        write(path, path.read_text())
        await until_true(lambda: done)
        assert done[0] is False and len(applied.configs) == 1
        await reloader.close()

    asyncio.run(scenario())


def test_the_rescan_finds_changes_when_inotify_is_off(tmp_path):
    path = tmp_path / "config.yaml"
    cfg = base_config(tmp_path, [inline("one", default=True)])
    cfg["reload"] = {"watch": False, "rescan_interval": "200ms"}
    path.write_text(yaml.safe_dump(cfg))

    async def scenario():
        reloader, applied = start(path)
        await reloader.start()
        assert reloader.report()["inotify"] is False
        cfg["networks"].append(inline("two"))
        write(path, yaml.safe_dump(cfg))
        new = await applied.next()
        assert [n.name for n in new.networks] == ["one", "two"]
        await reloader.close()

    asyncio.run(scenario())


def test_malformed_yaml_is_refused_with_its_location_and_the_running_config_stays(tmp_path, caplog):
    path = tmp_path / "config.yaml"
    good = yaml.safe_dump(base_config(tmp_path, [inline("one", default=True)]))
    path.write_text(good)

    async def scenario():
        reloader, applied = start(path)
        before = reloader.cfg
        await reloader.start()
        with caplog.at_level(logging.ERROR, logger="nri_cni.reload"):
            write(path, good + "networks:\n  - name: [unclosed\n")
            await refusal(reloader)
        assert applied.configs == [] and reloader.cfg is before
        refused = reloader.report()["refused"]
        assert refused.startswith(f"{path}:") and "not valid YAML" in refused
        assert f"{path}:" in caplog.text and "the running configuration stays" in caplog.text
        write(path, good.replace("one", "uno"))  # fixed: applied, and the refusal is cleared
        cfg = await applied.next()
        assert [n.name for n in cfg.networks] == ["uno"] and reloader.report()["refused"] == ""
        await reloader.close()

    asyncio.run(scenario())


def test_a_change_with_one_bad_network_is_refused_as_a_whole(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(base_config(tmp_path, [inline("one", default=True)])))
    bad_lifecycle = inline("three", **{"cni.dev/lifecycle": ["init", "reboot"]})

    async def scenario():
        reloader, applied = start(path)
        await reloader.start()
        write(
            path,
            yaml.safe_dump(
                base_config(tmp_path, [inline("one", default=True), inline("two"), bad_lifecycle])
            ),
        )
        await refusal(reloader)
        assert applied.configs == [] and [n.name for n in reloader.cfg.networks] == ["one"]
        refused = reloader.report()["refused"]
        assert "networks[2].conflist" in refused and "'reboot'" in refused
        await reloader.close()

    asyncio.run(scenario())


def test_a_setting_that_needs_a_restart_refuses_the_change(tmp_path):
    path = tmp_path / "config.yaml"
    cfg = base_config(tmp_path, [inline("one", default=True)])
    path.write_text(yaml.safe_dump(cfg))

    async def scenario():
        reloader, applied = start(path)
        await reloader.start()
        cfg["daemon"]["socket"] = str(tmp_path / "other.sock")
        cfg["networks"].append(inline("two"))
        write(path, yaml.safe_dump(cfg))
        await refusal(reloader)
        assert applied.configs == []
        assert "daemon.socket needs a restart" in reloader.report()["refused"]
        await reloader.close()

    asyncio.run(scenario())


def test_drop_in_plugins_are_appended_reloaded_and_turned_off_by_load_only_inlined(tmp_path):
    conf_dir = tmp_path / "conf"
    conf_dir.mkdir()
    base = {"cniVersion": "1.1.0", "name": "dropnet", "plugins": [{"type": "fake-ok", "n": 0}]}
    (conf_dir / "10-dropnet.conflist").write_text(json.dumps(base))
    path = tmp_path / "config.yaml"
    path.write_text(
        yaml.safe_dump(
            base_config(tmp_path, [{"name": "dropnet", "default": True, "conf_dir": str(conf_dir)}])
        )
    )

    async def scenario():
        reloader, applied = start(path)
        await reloader.start()
        assert [p.conf.get("n") for p in reloader.cfg.networks[0].conflist.plugins] == [0]
        # the drop-in dir does not exist yet: its creation in the watched conf dir is seen
        (conf_dir / "dropnet").mkdir()
        await until_true(lambda: str(conf_dir / "dropnet") in reloader._watcher.watched)
        write(conf_dir / "dropnet" / "20-second.conf", json.dumps({"type": "fake-ok", "n": 2}))
        write(conf_dir / "dropnet" / "10-first.conf", json.dumps({"type": "fake-ok", "n": 1}))
        (conf_dir / "dropnet" / "30-ignored.json").write_text(json.dumps({"type": "x"}))
        net = None
        for _ in range(3):  # one reload per file at most
            net = (await applied.next()).networks[0].conflist
            if len(net.plugins) == 3:
                break
        assert [p.conf.get("n") for p in net.plugins] == [0, 1, 2]  # appended in file order
        cached = json.loads(net.bytes)  # what ADD caches and the generation is the hash of
        assert [p["n"] for p in cached["plugins"]] == [0, 1, 2]
        assert cached["loadOnlyInlinedPlugins"] is True  # a DEL from the cache appends nothing
        assert generation_id(net.bytes) != generation_id(json.dumps(base).encode())

        write(conf_dir / "10-dropnet.conflist", json.dumps({**base, "loadOnlyInlinedPlugins": True}))
        net = (await applied.next()).networks[0].conflist
        assert [p.conf.get("n") for p in net.plugins] == [0]
        await reloader.close()

    asyncio.run(scenario())


def test_finalize_drop_ins_are_reloaded_and_a_bad_one_is_refused(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(base_config(tmp_path, [inline("one", default=True)])))
    finalize = tmp_path / "net.d" / "_finalize.d"

    async def scenario():
        reloader, applied = start(path)
        await reloader.start()
        assert str(finalize) in watched_dirs(reloader.cfg)
        write(finalize / "50-routes.conf", json.dumps({"type": "fake-finalize"}))
        await applied.next()
        assert [p.type for p in reloader._dropins] == ["fake-finalize"]
        write(finalize / "60-bad.conf", "{not json")
        await refusal(reloader)
        assert len(applied.configs) == 1
        assert "60-bad.conf" in reloader.report()["refused"]
        await reloader.close()

    asyncio.run(scenario())


def test_the_dir_watcher_reports_changes_and_skips_missing_dirs(tmp_path):
    async def scenario(top, outside: bool) -> int:
        seen = []
        watcher = DirWatcher(lambda: seen.append(time.monotonic()))
        top.mkdir()
        watched = top / "w"
        watched.mkdir()
        added = watcher.watch([str(watched), str(top / "missing")])
        assert added == {str(watched)} and watcher.watched == {str(watched)}
        if outside:
            (top / "outside").write_text("x")
        (watched / "f").write_text("x")
        await until_true(lambda: seen)
        (watched / "f").unlink()
        watched.rmdir()
        await until_true(lambda: watcher.watched == set())  # the kernel dropped the watch with the directory
        watcher.close()
        return len(seen)  # every event of the one inotify fd is read: the last came (in order)

    # a write outside the watched dir adds no call: the control makes the same changes without it
    assert asyncio.run(scenario(tmp_path / "a", True)) == asyncio.run(scenario(tmp_path / "b", False))


@pytest.mark.parametrize(
    "value, message",
    [
        ("init", "must be a list"),
        (["init", "start"], "unknown verb"),
    ],
)
def test_a_bad_lifecycle_key_is_a_config_error_with_its_location(tmp_path, value, message):
    from nri_cni.config import parse_config
    from nri_cni.errors import ConfigError

    cfg = base_config(tmp_path, [inline("one", default=True), inline("two", **{"cni.dev/lifecycle": value})])
    with pytest.raises(ConfigError) as err:
        parse_config(cfg, str(tmp_path / "config.yaml"))
    assert "networks[1].conflist" in str(err.value) and "plugins[0]" in str(err.value)
    assert message in str(err.value)


# One change per restart-only key (nri_cni/daemon/reload.py RESTART_ONLY), applied to a config
# made by base_config; each must be refused with the key named.
RESTART_ONLY_CHANGES = {
    "mode": lambda c, t: c.update(mode="shim"),
    "nri.*": lambda c, t: c["nri"].update(plugin_name="other"),
    "daemon.socket": lambda c, t: c["daemon"].update(socket=str(t / "other.sock")),
    "daemon.allowed_gids": lambda c, t: c["daemon"].update(allowed_gids=[4242]),
    "state_dir": lambda c, t: c.update(state_dir=str(t / "state2")),
    "log.format": lambda c, t: c.update(log={"format": "json"}),
    "cni.bin_dirs": lambda c, t: c["cni"].update(bin_dirs=[str(t / "bin2")]),
    "cni.cache_dir": lambda c, t: c["cni"].update(cache_dir=str(t / "cache2")),
    "cni.plugin_timeout": lambda c, t: c["cni"].update(plugin_timeout="7s"),
    "cni.plugin_env": lambda c, t: c["cni"].update(plugin_env=["HTTP_PROXY"]),
    "cni.runtime_cache_dir": lambda c, t: c["cni"].update(runtime_cache_dir=str(t / "rt")),
    "files.trust": lambda c, t: c.update(files={"trust": "warn"}),
    "gc.interval": lambda c, t: c.update(gc={"interval": "7s"}),
    "status.interval": lambda c, t: c.update(status={"interval": "7s"}),
    "verify.interval": lambda c, t: c.update(verify={"interval": "7s"}),
    "repair": lambda c, t: c.update(repair="verify-only"),
    "limits.parallel_per_node": lambda c, t: c.update(limits={"parallel_per_node": 3}),
    "metrics.listen": lambda c, t: c.update(metrics={"listen": "127.0.0.1:9999"}),
    "metrics.max_connections": lambda c, t: c.update(metrics={"max_connections": 3}),
    "metrics.timeout": lambda c, t: c.update(metrics={"timeout": "7s"}),
    "lifecycle.*": lambda c, t: c.update(lifecycle={"retry_initial": "2s"}),
    "reload.*": lambda c, t: c["reload"].update(debounce="70ms"),
}

# The control cases: settings read where they are used, applied by the same kind of change.
LIVE_CHANGES = {
    "verify.check_every": lambda c, t: c.update(verify={"check_every": 3}),
    "gc.parallel": lambda c, t: c.update(gc={"parallel": 3}),
    "gc.unlisted_grace": lambda c, t: c.update(gc={"unlisted_grace": "7s"}),
    "limits.parallel_per_pod": lambda c, t: c.update(limits={"parallel_per_pod": 3}),
    "daemon.max_connections": lambda c, t: c["daemon"].update(max_connections=3),
    "failure_policy": lambda c, t: c.update(failure_policy="keep"),
    "log.level": lambda c, t: c.update(log={"level": "debug"}),
}


def test_every_restart_only_key_has_a_change_below():
    assert [key for key, _ in RESTART_ONLY] == list(RESTART_ONLY_CHANGES)


def test_docs_list_the_restart_only_keys_of_the_code():
    text = (Path(__file__).parents[3] / "docs" / "lifecycle.md").read_text()
    section = text.split("### Restart-only settings", 1)[1].split("\n#", 1)[0]
    listed = re.findall(r"^- `([^`]+)`$", section, re.MULTILINE)
    assert listed == [key for key, _ in RESTART_ONLY]


def reload_once(tmp_path, change) -> tuple[ConfigReloader, Applied, bool, object]:
    """Writes a config, starts a reloader on it, writes it again with `change` made, and reloads
    once (no watcher: the reload is the event)."""
    path = tmp_path / "config.yaml"
    cfg = base_config(tmp_path, [inline("one", default=True)])
    path.write_text(yaml.safe_dump(cfg))
    reloader, applied = start(path)
    before = reloader.cfg
    change(cfg, tmp_path)
    write(path, yaml.safe_dump(cfg))
    applied_now = asyncio.run(reloader.reload_now("test"))
    return reloader, applied, applied_now, before


@pytest.mark.parametrize("key", list(RESTART_ONLY_CHANGES))
def test_a_restart_only_setting_is_refused_by_reload_with_its_key_named(tmp_path, key):
    reloader, applied, applied_now, before = reload_once(tmp_path, RESTART_ONLY_CHANGES[key])
    assert not applied_now and applied.configs == [] and reloader.cfg is before
    assert f"changing {key} needs a restart" in reloader.report()["refused"]


@pytest.mark.parametrize("key", list(LIVE_CHANGES))
def test_a_live_setting_is_applied_by_reload(tmp_path, key):
    reloader, applied, applied_now, before = reload_once(tmp_path, LIVE_CHANGES[key])
    assert applied_now and applied.configs == [reloader.cfg] and reloader.cfg != before
    assert reloader.report()["refused"] == ""
