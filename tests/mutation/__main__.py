"""Runs mutmut on the decision modules and checks its survivors against survivors.toml.

    .venv/bin/python -m tests.mutation [--jobs N] [MODULE...]

MODULE is a path from [tool.mutmut] only_mutate in pyproject.toml (default: all of them). The
run happens (as nobody when started as root) in a fresh copy of the work tree's tracked files (tempdir), so neither an earlier
run's mutants/ nor anything else on the host decides it. Each mutant runs only the unit tests
that reached its function (mutmut's stats), with -x. Prints killed / total per module; exits 1
when a survivor is not listed in survivors.toml with the reason it is equivalent.
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SURVIVORS = Path(__file__).with_name("survivors.toml")
# mutmut's exit codes (mutmut.stats.status_by_exit_code): a timeout is a kill (the mutant made
# a test hang), "no tests" and "suspicious" count as survivors.
KILLED = {1, 3, 36, 24, -24, 152, 255, 37}
SKIPPED = {34}
UNPRIVILEGED = "nobody"  # the user .ci/unit-as-nobody runs the unit subset as


@dataclass(frozen=True)
class Mutant:
    name: str  # mutmut's, e.g. nri_cni.nri.stub.xǁStubǁrun__mutmut_3
    module: str  # nri_cni/nri/stub.py
    function: str  # Stub.run
    change: tuple[str, ...]  # the diff's -/+ lines, stripped


def function_of(name: str) -> str:
    tail = name.rsplit(".", 1)[-1]
    tail = re.sub(r"__mutmut_\d+$", "", tail)
    tail = tail.removeprefix("xǁ").removeprefix("x_")
    return tail.replace("ǁ", ".")


def configured_modules() -> list[str]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mutmut"]["only_mutate"]


def copy_tree(dest: Path, modules: list[str]) -> None:
    """The tracked files as they are in the work tree; only_mutate narrowed to `modules`."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout
    for rel in filter(None, listed.decode().split("\0")):
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    text = (dest / "pyproject.toml").read_text()
    narrowed = "only_mutate = " + json.dumps(modules)
    text, n = re.subn(r"(?ms)^only_mutate = \[.*?\]", lambda _: narrowed, text, count=1)
    assert n == 1, "pyproject.toml: [tool.mutmut] only_mutate not found"
    (dest / "pyproject.toml").write_text(text)


def as_unprivileged(workdir: Path) -> list[str]:
    """As root, the mutants run as nobody (the copy made theirs), as the unit subset does in
    .ci/run: a unit test run by root takes the machine-wide lock of the integration tests
    (tests/conftest.py), and every mutant would wait for other runs' tests."""
    if os.geteuid() != 0:
        return []
    user = pwd.getpwnam(UNPRIVILEGED)
    subprocess.run(["chown", "-R", f"{user.pw_uid}:{user.pw_gid}", str(workdir)], check=True)
    return ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups"]


def collect(workdir: Path, modules: list[str]) -> tuple[dict[str, dict[str, int]], list[Mutant]]:
    """Counts per module and the survivors, read from mutmut's results in `workdir`."""
    os.chdir(workdir)  # mutmut reads its config and results relative to the cwd
    from mutmut.mutation.diff_apply import get_diff_for_mutant

    counts: dict[str, dict[str, int]] = {}
    survivors = []
    for module in modules:
        meta = json.loads((workdir / "mutants" / (module + ".meta")).read_text())
        c = counts[module] = {"killed": 0, "total": 0}
        for name, code in sorted(meta["exit_code_by_key"].items()):
            if code in SKIPPED:
                continue
            c["total"] += 1
            if code in KILLED:
                c["killed"] += 1
                continue
            diff = get_diff_for_mutant(name, path=module)
            change = tuple(
                line[0] + line[1:].strip()
                for line in diff.splitlines()
                if line[:1] in "-+" and not line.startswith(("---", "+++"))
            )
            survivors.append(Mutant(name, module, function_of(name), change))
    return counts, survivors


def reviewed() -> list[dict]:
    return tomllib.loads(SURVIVORS.read_text()).get("survivor", [])


def key(module: str, function: str, change: list[str] | tuple[str, ...]) -> tuple:
    return module, function, tuple(change)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.mutation", description=__doc__.split("\n\n")[0])
    ap.add_argument("modules", nargs="*", help="paths from [tool.mutmut] only_mutate (default: all)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="mutants run at once")
    ap.add_argument("--keep", action="store_true", help="keep the working copy (its mutants/) to look at")
    args = ap.parse_args(argv)
    configured = configured_modules()
    modules = args.modules or configured
    unknown = [m for m in modules if m not in configured]
    if unknown:
        ap.error(f"not in [tool.mutmut] only_mutate: {', '.join(unknown)}")
    workdir = Path(tempfile.mkdtemp(prefix="nri-cni-mutation."))
    try:
        copy_tree(workdir, modules)
        mutmut = [str(Path(sys.executable).with_name("mutmut")), "run", "--max-children", str(args.jobs)]
        run = subprocess.run(
            as_unprivileged(workdir) + mutmut, cwd=workdir, env={**os.environ, "HOME": str(workdir)}
        )
        if run.returncode != 0:
            print(f"mutmut run failed (exit {run.returncode})", file=sys.stderr)
            return 2
        counts, survivors = collect(workdir, modules)
    finally:
        os.chdir(ROOT)
        if args.keep:
            print(f"working copy kept: {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    listed = {key(s["module"], s["function"], s["change"]): s for s in reviewed()}
    print("\nmodule                                killed / total")
    for module, c in counts.items():
        pct = 100.0 * c["killed"] / c["total"] if c["total"] else 100.0
        print(f"{module:38}{c['killed']:5} / {c['total']:<5} {pct:5.1f} %")
    unlisted = [m for m in survivors if key(m.module, m.function, m.change) not in listed]
    seen = {key(m.module, m.function, m.change) for m in survivors}
    stale = [s for k, s in listed.items() if k[0] in modules and k not in seen]
    for s in stale:
        print(f"listed but killed now (remove it from {SURVIVORS.name}): {s['module']} {s['function']}")
    for m in unlisted:
        print(f"\nUNLISTED SURVIVOR {m.name}\n  {m.module} {m.function}")
        for line in m.change:
            print(f"    {line}")
    if unlisted:
        print(
            f"\n{len(unlisted)} survivor(s) not in {SURVIVORS.relative_to(ROOT)}: kill them or argue them there"
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
