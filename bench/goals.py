"""The benches' goals, in one place: `python -m bench` judges its rows by them, and the goal
tables of bench/README.md and docs/performance.md are written from them (`python -m bench
--write-goals`); tests/repo/test_bench_goals.py fails when a doc disagrees with this table.

A row's verdict (`met`): "yes", "NO", "-" (a row without a goal), "FAILED" (its bench failed)
or "not measured" (the row has a goal and no figure: an anchor or a part missing).
`python -m bench --strict` fails on "NO", "FAILED" and "not measured" (`strict_failures`).
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

YES, NO, NO_GOAL, FAILED, NOT_MEASURED = "yes", "NO", "-", "FAILED", "not measured"


@dataclass(frozen=True)
class Goal:
    key: str
    about: str  # the figure the goal is about, as the docs name it
    text: str  # the goal as the table prints it
    test: Callable[[float], bool]  # the figure -> met


def _cmp(op: Callable[[float, float], bool], bound: float) -> Callable[[float], bool]:
    return lambda value: op(value, bound)


_LE, _GE, _LT = operator.le, operator.ge, operator.lt

GOALS: dict[str, Goal] = {
    g.key: g
    for g in (
        Goal(
            "cni_floor",
            "CNI runtime, real chain ADD / exec floor (paired median)",
            "<= 1.02",
            _cmp(_LE, 1.02),
        ),
        Goal(
            "cni_libcni",
            "CNI runtime, real chain ADD / libcni AddNetworkList (paired median)",
            "<= 1.02",
            _cmp(_LE, 1.02),
        ),  # fmt: skip
        Goal(
            "own_call",
            "nri-cni's own cost per plugin call (no-op chain, ADD): information (issue 33), a real chain "
            "is judged by `cni_floor` and `cni_libcni`",
            "-",
            lambda _v: True,
        ),  # fmt: skip
        Goal("gc", "GC of stale attachments, libcni's time / nri-cni's", ">= 2.5x", _cmp(_GE, 2.5)),
        Goal(
            "containers",
            "container creation, CreateContainer adjusted / not (bench_containers.py, median)",
            "<= 1.02",
            _cmp(_LE, 1.02),
        ),  # fmt: skip
        Goal("add_during_gc", "pod ADD while the daemon GCs / idle ADD", "<= 1.5x", _cmp(_LE, 1.5)),
        Goal(
            "secondary_extra",
            "secondary mode: extra network's cost / containerd's own 2nd network",
            "<= 1.2x",
            _cmp(_LE, 1.2),
        ),  # fmt: skip
        Goal(
            "secondary_extra_serial",
            "the same / containerd's 2nd network set up after eth0",
            "<= 1.2x",
            _cmp(_LE, 1.2),
        ),  # fmt: skip
        Goal(
            "secondary_burst",
            "secondary mode: pods/s / containerd's own 2nd network",
            ">= 0.9x",
            _cmp(_GE, 0.9),
        ),
        Goal(
            "creation",
            "pod creation, shim / containerd's own CNI (RunPodSandbox medians)",
            "<= 1.03",
            _cmp(_LE, 1.03),
        ),  # fmt: skip
        Goal(
            "floor",
            "pod creation, a shim set-up doing nothing (containerd's own CNI + a null shim chained + a "
            "null NRI plugin) / containerd's own CNI: what no daemon's work is in",
            "-",
            lambda _v: True,
        ),  # fmt: skip
        Goal(
            "crio_creation_records",
            "CRI-O pod creation, shim (CHECK answered from records) / CRI-O's own CNI "
            "(the plugins' CHECK): not the same work",
            "-",
            lambda _v: True,
        ),  # fmt: skip
        Goal(
            "crio_creation",
            "CRI-O pod creation, shim with the plugins' CHECK / CRI-O's own CNI",
            "<= 1.03",
            _cmp(_LE, 1.03),
        ),  # fmt: skip
        Goal(
            "crio_floor",
            "CRI-O, a shim set-up doing nothing (its own CNI + a null shim chained + a null NRI "
            "plugin) / CRI-O's own CNI: what no daemon's work is in",
            "-",
            lambda _v: True,
        ),  # fmt: skip
        Goal(
            "crio_stop_remove",
            "CRI-O stop+remove, shim / CRI-O's own CNI (medians)",
            "<= 1.03",
            _cmp(_LE, 1.03),
        ),
        Goal(
            "attach3",
            "3-network pod, shim / containerd max_conf_num = 3 (RunPodSandbox medians)",
            "<= 1.0",
            _cmp(_LE, 1.0),
        ),  # fmt: skip
        Goal(
            "attach_at_once",
            "3 networks ADDed at once / the larger of the slowest chain alone and the plugins' CPU time "
            "divided by the CPUs",
            "<= 1.10",
            _cmp(_LE, 1.10),
        ),  # fmt: skip
        Goal(
            "verify_cadence",
            "the daemon's verify round, 500 dual-stack pods, CHECK cadence on (mean, s)",
            "< 1 s",
            _cmp(_LT, 1.0),
        ),  # fmt: skip
        Goal(
            "restart", "daemon restart with 500 pods, until verified (s)", "< 2 s, verified", _cmp(_LT, 2.0)
        ),
        Goal(
            "memory",
            "resident memory over a 500-pod churn (max MiB; the end within 10% of the first)",
            "< 40 MiB, flat within 10%",
            _cmp(_LT, 40.0),
        ),  # fmt: skip
        Goal("verify", "verify of 500 dual-stack pods (s)", "< 1 s", _cmp(_LT, 1.0)),
        Goal("verify_host", "the same with routes, DNAT rules and leases (s)", "< 1 s", _cmp(_LT, 1.0)),
        Goal(
            "ttrpc",
            "NRI request, bare round trip over a socket echo (us added)",
            "keep (+37-45 us)",
            _cmp(_LE, 45.0),
        ),  # fmt: skip
    )
}


def met(key: str, value: float | None) -> str:
    """The verdict of a row with goal `key` and figure `value` (None: not measured)."""
    goal = GOALS[key]
    if goal.text == NO_GOAL:
        return NO_GOAL
    if value is None:
        return NOT_MEASURED
    return YES if goal.test(value) else NO


def met_ratio(key: str, figure: float, anchor: float) -> str:
    """The verdict of the ratio figure / anchor, both measured. An anchor <= 0 (a difference of
    two timings that noise swamped, e.g. on a loaded machine) gives no ratio: the goal is not
    shown (NO), and the row was measured all the same (never "not measured")."""
    goal = GOALS[key]
    if goal.text == NO_GOAL:
        return NO_GOAL
    return met(key, figure / anchor) if anchor > 0 else NO


def strict_failures(verdicts: Iterable[tuple[str, str]]) -> list[str]:
    """The figures (figure, met) that make `--strict` fail: a goal missed, a bench failed, a
    row with a goal that was not measured."""
    return [fig for fig, m in verdicts if m in (NO, FAILED) or m.startswith(NOT_MEASURED)]


# -- the docs' goal tables ---------------------------------------------------------------------

BEGIN, END = "<!-- goals: begin (bench/goals.py; python -m bench --write-goals) -->", "<!-- goals: end -->"
DOCS = ("bench/README.md", "docs/performance.md")


def markdown() -> str:
    lines = ["| key | figure | goal |", "|---|---|---|"]
    lines += [f"| `{g.key}` | {g.about} | {g.text} |" for g in GOALS.values()]
    return "\n".join(lines)


def with_goals(doc: str) -> str:
    """`doc` with its goal section (between BEGIN and END) written from GOALS."""
    head, sep, rest = doc.partition(BEGIN)
    if not sep or END not in rest:
        raise ValueError("no goal section (BEGIN ... END)")
    return head + BEGIN + "\n" + markdown() + "\n" + END + rest.partition(END)[2]


# A published table (TABLE_BEGIN ... TABLE_END, written by `python -m bench --write-doc`) ends
# with the goal key of each row, in the rows' order.
TABLE_BEGIN = "<!-- bench table: begin (python -m bench --write-doc) -->"
TABLE_END = "<!-- bench table: end -->"
_KEYS = re.compile(r"<!-- goal keys: ([^>]*) -->")


# a goal stated in prose ("goal <= 1.10", "target **< 0.3 ms**"): the docs name a goal by its key
_STATED = re.compile(r"(?i)\b(?:goal|target)s?\b[^.\n|`]{0,30}?(?:[<>]=?|≤|≥)\s*[+\d]")


def _outside_sections(doc: str) -> str:
    for begin, end in ((BEGIN, END), (TABLE_BEGIN, TABLE_END)):
        head, sep, rest = doc.partition(begin)
        doc = head + (rest.partition(end)[2] if sep else "")
    return doc


def disagreements(doc: str) -> list[str]:
    """Where `doc` (README or performance page) says other goals than GOALS: its goal section,
    each row of its published table against the goal of its key, and goals stated in prose."""
    out = [
        f"a goal stated outside bench/goals.py: {m.group(0)!r}"
        for m in _STATED.finditer(_outside_sections(doc))
    ]
    try:
        if with_goals(doc) != doc:
            out.append("its goal section is not bench/goals.py's table (python -m bench --write-goals)")
    except ValueError as exc:
        out.append(str(exc))
    if TABLE_BEGIN in doc:
        table = doc.partition(TABLE_BEGIN)[2].partition(TABLE_END)[0]
        keys_line = _KEYS.search(table)
        rows = [ln for ln in table.splitlines() if ln.startswith("| ") and not ln.startswith("| figure ")]
        keys = [k.strip() for k in keys_line.group(1).split(",")] if keys_line else []
        if len(keys) != len(rows):
            out.append(f"the published table has {len(rows)} rows and {len(keys)} goal keys")
        for key, row in zip(keys, rows):
            cells = [c.strip() for c in row.strip("|").split(" | ")]
            goal = NO_GOAL if key == NO_GOAL else GOALS[key].text if key in GOALS else None
            if goal is None or cells[4] != goal:
                out.append(f"published row {cells[0]!r}: goal {cells[4]!r}, bench/goals.py: {goal!r} ({key})")
    return out
