"""The `nri-cni` command line.

Each command group lives next to the code it drives and registers itself here through a
`register(subparsers)` function that adds its sub-parser and sets `func` (the handler, taking
the parsed args and returning an exit code). Modules are imported only when listed here, so
`nri-cni --help` stays fast.

Exit codes (distinct, as node tooling expects):
  0 ok, 1 operation failed, 2 usage or config error, 3 daemon or runtime unreachable,
  4 a CNI plugin reported an error, 130 interrupted.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from nri_cni.errors import (  # the exit codes live in the errors' WIRE table
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_PLUGIN,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    NriCniError,
    exit_code_for,
)

__all__ = [
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_PLUGIN",
    "EXIT_UNAVAILABLE",
    "EXIT_USAGE",
    "build_parser",
    "main",
]

# Command groups; each module has register(subparsers).
COMMAND_MODULES = (
    "nri_cni.cli.daemon",
    "nri_cni.cli.cnitool",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="nri-cni",
        description="NRI plugin that runs CNI networks for pods (see README.md).",
    )
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.version:
        from nri_cni import __version__

        print(__version__)
        return EXIT_OK
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except NriCniError as exc:
        print(f"nri-cni: {exc}", file=sys.stderr)
        return exit_code_for(exc)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
