"""A refused config change as an admin meets it: one log line with time and level,
and the refusal goes once the files say what runs again, even when nothing is applied."""

from __future__ import annotations

import asyncio
import io
import logging
import re

import yaml

from nri_cni.cli.logsetup import setup_logging
from tests.support.reloading import base_config, inline, refusal, start, write


def test_a_refusal_clears_when_the_running_file_is_written_back(tmp_path):
    path = tmp_path / "config.yaml"
    good = yaml.safe_dump(base_config(tmp_path, [inline("one", default=True)]))
    path.write_text(good)

    async def scenario():
        reloader, applied = start(path)
        await reloader.start()
        write(path, good + "networks:\n  - name: [unclosed\n")
        assert "not valid YAML" in await refusal(reloader)
        write(path, good)  # the admin restores the file: identical to what runs
        assert await refusal(reloader, cleared=True) == ""  # nothing refused any more ...
        assert applied.configs == []  # ... and nothing to apply
        await reloader.close()

    asyncio.run(scenario())


def test_a_refusal_is_one_log_line_with_time_and_level(tmp_path):
    path = tmp_path / "config.yaml"
    cfg = base_config(tmp_path, [inline("one", default=True)])
    path.write_text(yaml.safe_dump(cfg))
    cfg["networks"].append({"name": "two"})  # neither conflist, file nor conf_dir
    out = io.StringIO()
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    setup_logging("info", "text")
    root.handlers[0].setStream(out)

    async def scenario():
        reloader, _ = start(path)
        await reloader.start()
        write(path, yaml.safe_dump(cfg))
        await refusal(reloader)
        await reloader.close()
        return reloader.report()["refused"]

    try:
        refused = asyncio.run(scenario())
    finally:
        root.handlers[:], _ = saved[0], root.setLevel(saved[1])
    assert "networks[1]" in refused
    lines = [line for line in out.getvalue().splitlines() if line.strip()]
    stamp = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ [A-Z]+ ")
    assert all(stamp.match(line) for line in lines), lines
    refusals = [line for line in lines if "configuration change refused" in line]
    assert len(refusals) == 1 and " ERROR nri_cni.reload: " in refusals[0]
    assert f"{path}: networks[1]: needs exactly one of" in refusals[0]
