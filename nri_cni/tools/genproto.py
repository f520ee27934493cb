"""Regenerate nri_cni/api/*_pb2.py(i) from proto/*.proto.

    python -m nri_cni.tools.genproto           # rewrite the checked-in code
    python -m nri_cni.tools.genproto --check   # exit 1 if the checked-in code is stale

protoc comes from grpcio-tools, pinned in pyproject.toml: another protoc writes different bytes
(and a different runtime-version guard), so --check is only meaningful with the pinned one.
protoc emits `import x_pb2` for a proto importing x.proto, which only works with the output
directory on sys.path; the imports between our own modules are rewritten to package-relative.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
import tempfile
from importlib import metadata, resources
from pathlib import Path

from grpc_tools import protoc

PINNED_GRPCIO_TOOLS = "1.85.1"
REPO = Path(__file__).resolve().parents[2]
PROTO_DIR = REPO / "proto"
OUT_DIR = REPO / "nri_cni" / "api"
# Listed, not globbed: proto/ also holds protos that other packages generate (cri*).
PROTOS = ("rpc_status.proto", "ttrpc.proto", "nri.proto")
SUFFIXES = ("_pb2.py", "_pb2.pyi")


def _own_modules() -> set[str]:
    return {name.removesuffix(".proto") + "_pb2" for name in PROTOS}


def rewrite_imports(text: str) -> str:
    """Turn `import x_pb2 as y` into `from . import x_pb2 as y` for our own modules."""
    own = _own_modules()

    def fix(match: re.Match[str]) -> str:
        module, alias = match.group(1), match.group(2)
        return f"from . import {module} as {alias}" if module in own else match.group(0)

    return re.sub(r"^import (\w+) as (\w+)$", fix, text, flags=re.MULTILINE)


def generate(dest: Path) -> list[Path]:
    """Run protoc into dest; returns the files written (imports already rewritten)."""

    include = resources.files("grpc_tools") / "_proto"
    args = [
        "protoc",
        f"-I{PROTO_DIR}",
        f"-I{include}",
        f"--python_out={dest}",
        f"--pyi_out={dest}",
        *(str(PROTO_DIR / name) for name in PROTOS),
    ]
    if protoc.main(args) != 0:
        raise SystemExit("genproto: protoc failed (its message is above)")
    written = []
    for name in PROTOS:
        for suffix in SUFFIXES:
            path = dest / (name.removesuffix(".proto") + suffix)
            path.write_text(rewrite_imports(path.read_text()))
            written.append(path)
    return written


def _shown(path: Path) -> str:
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def _version_warning() -> str:
    installed = metadata.version("grpcio-tools")
    if installed == PINNED_GRPCIO_TOOLS:
        return ""
    return f"genproto: grpcio-tools {installed} installed, {PINNED_GRPCIO_TOOLS} pinned\n"


def check() -> int:
    """1 if a generated file differs from (or is missing in) nri_cni/api, else 0."""
    stale = []
    with tempfile.TemporaryDirectory() as tmp:
        for fresh in generate(Path(tmp)):
            current = OUT_DIR / fresh.name
            want = fresh.read_text()
            have = current.read_text() if current.exists() else ""
            if want != have:
                stale.append(current)
                sys.stdout.writelines(
                    difflib.unified_diff(
                        have.splitlines(True),
                        want.splitlines(True),
                        f"{current} (checked in)",
                        f"{current} (generated)",
                        n=1,
                    )
                )
    if stale:
        sys.stderr.write(_version_warning())
        sys.stderr.write(
            "genproto: stale, run `python -m nri_cni.tools.genproto`: "
            + ", ".join(_shown(p) for p in stale)
            + "\n"
        )
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m nri_cni.tools.genproto",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="compare instead of writing; exit 1 if the checked-in code is stale",
    )
    args = parser.parse_args(argv)
    if args.check:
        return check()
    sys.stderr.write(_version_warning())
    OUT_DIR.mkdir(exist_ok=True)
    for path in generate(OUT_DIR):
        print(f"wrote {_shown(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
