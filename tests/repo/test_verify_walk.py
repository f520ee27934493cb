"""The walk of one verify round that finds damage and repairs it, from its timer
(`ServiceTimers.verify_tick`) to the plugin exec (issue 31: "enters each service file at most
twice"). The round runs under `sys.setprofile`; an entry is a call of a function of a file from
a function of another file (a coroutine resumed by the event loop is not a new entry: it was
entered once, when first called); the event loop's thread is profiled (the round's one worker
thread reads the CNI cache, no service file). Without root: the plugins are the fake executor's, the node
inspector a fake that finds eth0 missing once."""

from __future__ import annotations

import sys
import types
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import nri_cni.service
from nri_cni.cni.executor import FakeExecutor
from nri_cni.service.podstate import PodState
from tests.support import verifyworld
from tests.support.verifyworld import Inspector

SERVICE = Path(nri_cni.service.__file__).parent  # where the files run from, as the profiler names them
MOST = 2  # entries per service file in one round's walk
# known to enter more often, with how often at most: each to be brought to MOST and then dropped
# from here (a file listed that no longer exceeds its count fails the test: the list only shrinks)
KNOWN: dict[str, int] = {}

POD = "e8" * 32
IP = "10.78.0.2"
_RESUMABLE = 0x20 | 0x80 | 0x200  # CO_GENERATOR, CO_COROUTINE, CO_ASYNC_GENERATOR


class Walk:
    """Counts, per file, how often control entered it from another file (see the module's
    docstring); `exec_seen` turns true when the walk reached the executor."""

    def __init__(self) -> None:
        self.entries: Counter[str] = Counter()
        self._started: set[types.FrameType] = set()  # coroutines entered once (held: no id reuse)

    def profile(self, frame: types.FrameType, event: str, _arg: Any) -> None:
        if event != "call":
            return
        if frame.f_code.co_flags & _RESUMABLE:
            if frame in self._started:
                return  # resumed, not entered
            self._started.add(frame)
        caller = frame.f_back
        where = frame.f_code.co_filename
        if caller is None or caller.f_code.co_filename != where:
            self.entries[where] += 1

    @contextmanager
    def on(self) -> Iterator[Walk]:
        sys.setprofile(self.profile)
        try:
            yield self
        finally:
            sys.setprofile(None)

    def of(self, folder: Path) -> dict[str, int]:
        """The entries of each file in `folder`, by file name."""
        return {Path(f).name: n for f, n in self.entries.items() if Path(f).parent == folder}


def over(entries: dict[str, int], most: int) -> dict[str, int]:
    return {name: n for name, n in entries.items() if n > most}


# -- the counter itself, on a synthetic chain of modules ------------------------------------


def _module(tmp: Path, name: str, source: str) -> types.ModuleType:
    path = tmp / f"{name}.py"
    path.write_text(source)
    module = types.ModuleType(name)
    module.__file__ = str(path)
    exec(compile(source, str(path), "exec"), module.__dict__)
    return module


def _chain(tmp: Path, back_into_b: int) -> Callable[[], Any]:
    """a.run -> b.start -> c.step, c.step calling back into b `back_into_b` times (b.helper),
    and an async hop through the event loop in c (a task: resumed, never entered again)."""
    b = _module(tmp, "walk_b", "def helper():\n    return 1\n\ndef start(c):\n    return c.step()\n")
    c_src = (
        "import asyncio\n"
        "def step():\n"
        "    return asyncio.run(main())\n"
        "async def main():\n"
        "    await asyncio.sleep(0)\n"
        "    await asyncio.sleep(0)\n"
        f"    return sum(B.helper() for _ in range({back_into_b}))\n"
    )
    c = _module(tmp, "walk_c", c_src)
    c.B = b  # type: ignore[attr-defined]
    a = _module(tmp, "walk_a", "def run(b, c):\n    return b.start(c)\n")
    return lambda: a.run(b, c)


def test_the_counter_counts_each_entry_from_another_file(tmp_path):
    """b entered by a, then twice more from c (a generator expression in c calls b.helper) ->
    3; control: one call back into b -> 2. c's coroutine, resumed after each sleep, is one
    entry of c's `main` (from the event loop's file) beside the entry of `step`."""
    counts = {}
    for back in (2, 1):
        walk, folder = Walk(), tmp_path / str(back)
        folder.mkdir()
        run = _chain(folder, back)
        with walk.on():
            run()
        counts[back] = walk.of(folder)
    assert counts[2] == {"walk_a.py": 1, "walk_b.py": 3, "walk_c.py": 2}
    assert over(counts[2], MOST) == {"walk_b.py": 3}
    assert counts[1] == {"walk_a.py": 1, "walk_b.py": 2, "walk_c.py": 2}  # control
    assert over(counts[1], MOST) == {}


# -- the round ------------------------------------------------------------------------------


def test_a_verify_round_that_repairs_enters_each_service_file_at_most_twice(tmp_path):
    w = verifyworld.World(tmp_path, tag="e8", ip=IP, inspector=Inspector("damaged"))
    walk = Walk()

    async def scenario() -> None:
        await w.attached_and_listed()
        with walk.on():
            await w.svc.timers.verify_tick(runtime_connected=True)

    w.run(scenario)
    health = w.svc.health.get(POD)
    assert health is not None and health.state is PodState.REPAIRED, health  # the walk repaired
    assert w.fake.commands() == ["ADD", "CHECK", "DEL", "ADD"]  # ... down to the plugin exec
    executor = Path(sys.modules[FakeExecutor.__module__].__file__ or "")
    assert walk.entries[str(executor)] > 0
    entered = walk.of(SERVICE)
    assert {"timers.py", "verify.py", "podcheck.py", "decide.py"} <= set(entered), entered
    exceeding = over(entered, MOST)
    assert {name: n for name, n in exceeding.items() if n > KNOWN.get(name, MOST)} == {}, entered
    assert set(exceeding) == set(KNOWN), entered  # a file brought to MOST leaves KNOWN
