"""`nri-cni cni ...`: run one CNI verb by hand, in the spirit of cnitool.

    nri-cni cni add    NETWORK NETNS [options]   print the result JSON
    nri-cni cni check  NETWORK NETNS [options]
    nri-cni cni del    NETWORK NETNS [options]
    nri-cni cni status NETWORK [options]
    nri-cni cni gc     NETWORK [--valid CID/IFNAME ...] [options]
    nri-cni cni version PLUGIN [PLUGIN ...] [--bin-dir DIR]

NETWORK is looked up by name in --conf-dir (.conflist files first, then .conf/.json), unless
--conflist names the file. Defaults follow cnitool and its environment variables: the conf dir is
$NETCONFPATH or /etc/cni/net.d, the bin dirs $CNI_PATH (":"-separated) or /opt/cni/bin, --args
$CNI_ARGS, --cap-args $CAP_ARGS, --ifname $CNI_IFNAME or eth0, and the container ID is derived
from the absolute netns path exactly as cnitool does ("cnitool-" + the first 10 bytes of its
SHA-512 in hex), so that nri-cni and cnitool find each other's cache entries.

On failure the CNI error object ({cniVersion, code, msg, details}) is printed as the LAST line
of stderr, and the exit code says what kind of failure it was (see nri_cni.cli). Warnings of the
runtime (e.g. "no cached result, running without prevResult") come before it, one line each,
prefixed "nri-cni: warning:"; --quiet drops them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from nri_cni.cni.config import load_conf_dir, load_conflist_file, validate_ifname
from nri_cni.cni.versions import CURRENT
from nri_cni.errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE, CNIError, ConfigError, NriCniError, exit_code_for
from nri_cni.safety import jsonlimits, validate

if TYPE_CHECKING:
    from nri_cni.cni.config import NetworkConfigList
    from nri_cni.cni.runtime import Attachment, RuntimeConf

DEFAULT_CONF_DIR = "/etc/cni/net.d"
DEFAULT_BIN_DIR = "/opt/cni/bin"
DEFAULT_CACHE_DIR = "/var/lib/cni"


class _UsageError(Exception):
    """Bad command-line input that argparse itself cannot see (reported as CNI code 4/7)."""

    def __init__(self, msg: str, code: int = 4) -> None:
        super().__init__(msg)
        self.msg = msg
        self.code = code


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    cni = subparsers.add_parser(
        "cni",
        help="run a CNI verb by hand (like cnitool)",
        description="Run one CNI verb on a network, the way the daemon does (like cnitool).",
    )
    verbs = cni.add_subparsers(dest="cni_verb", metavar="VERB")
    cni.set_defaults(func=lambda args: _no_verb(cni))

    def common(p: argparse.ArgumentParser, *, runtime: bool) -> None:
        p.add_argument(
            "--bin-dir",
            action="append",
            default=None,
            metavar="DIR",
            help=f"where plugin binaries are (repeatable; default $CNI_PATH or {DEFAULT_BIN_DIR})",
        )
        p.add_argument(
            "--timeout", type=float, default=60.0, metavar="SECONDS", help="per plugin call (default 60)"
        )
        p.add_argument("-q", "--quiet", action="store_true", help="do not print warnings")
        if not runtime:
            return
        src = p.add_mutually_exclusive_group()
        src.add_argument(
            "--conf-dir",
            default=None,
            metavar="DIR",
            help=f"where to look NETWORK up (default $NETCONFPATH or {DEFAULT_CONF_DIR})",
        )
        src.add_argument(
            "--conflist",
            default=None,
            metavar="FILE",
            help="use this .conflist (or single .conf) file instead of a conf dir",
        )
        p.add_argument(
            "--cache-dir",
            default=DEFAULT_CACHE_DIR,
            metavar="DIR",
            help=f"libcni-compatible attachment cache (default {DEFAULT_CACHE_DIR})",
        )

    def attach(p: argparse.ArgumentParser) -> None:
        p.add_argument("network", metavar="NETWORK", help="network name")
        p.add_argument("netns", metavar="NETNS", help="network namespace path")
        p.add_argument(
            "--container-id",
            default=None,
            metavar="ID",
            help="default: derived from the netns path, as cnitool does",
        )
        p.add_argument(
            "--ifname",
            default=None,
            metavar="NAME",
            help="interface name in the netns (default $CNI_IFNAME or eth0)",
        )
        p.add_argument(
            "--args",
            dest="cni_args",
            default=None,
            metavar="K=V;...",
            help="CNI_ARGS pairs (default $CNI_ARGS)",
        )
        p.add_argument(
            "--cap-args",
            default=None,
            metavar="JSON",
            help="capability arguments, a JSON object (default $CAP_ARGS)",
        )
        common(p, runtime=True)

    for verb, helptext in (
        ("add", "attach NETNS to NETWORK and print the result"),
        ("check", "check an attachment"),
        ("del", "detach NETNS from NETWORK"),
    ):
        p = verbs.add_parser(verb, help=helptext, description=helptext)
        attach(p)
        p.set_defaults(func=_handler(verb))

    p = verbs.add_parser(
        "status",
        help="ask every plugin of NETWORK whether it is ready",
        description="Run STATUS on each plugin of NETWORK (first error wins).",
    )
    p.add_argument("network", metavar="NETWORK")
    common(p, runtime=True)
    p.set_defaults(func=_handler("status"))

    p = verbs.add_parser(
        "gc",
        help="garbage-collect NETWORK's attachments",
        description="DEL every cached attachment of NETWORK that is not --valid, then run GC on its plugins.",
    )
    p.add_argument("network", metavar="NETWORK")
    p.add_argument(
        "--valid",
        action="append",
        default=[],
        metavar="CID/IFNAME",
        help="an attachment to keep (repeatable); with none, everything is collected",
    )
    common(p, runtime=True)
    p.set_defaults(func=_handler("gc"))

    p = verbs.add_parser(
        "version",
        help="print the VERSION answer of plugin binaries",
        description="Run VERSION on each plugin type and print the answers.",
    )
    p.add_argument("plugins", nargs="+", metavar="PLUGIN", help="plugin type (binary name)")
    common(p, runtime=False)
    p.set_defaults(func=_handler("version"))


def _no_verb(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return EXIT_USAGE


# --------------------------------------------------------------------------------------------
# argument handling (no heavy imports here)


def default_container_id(netns: str) -> str:
    """cnitool's container ID: "cnitool-" and the first 10 bytes of SHA-512(netns path), in hex."""
    import hashlib  # lazy: ~2 ms (OpenSSL) that every `nri-cni` command would pay at start

    return "cnitool-" + hashlib.sha512(netns.encode()).digest()[:10].hex()


def args_option(text: str) -> list[tuple[str, str]]:
    """--args "K=V;K=V" into pairs, in order (the plugins see them so): the daemon's parser and rules."""
    try:
        return validate.cni_args_pairs(text)
    except validate.InvalidInput as exc:
        raise _UsageError(str(exc)) from None


def parse_cap_args(text: str) -> dict[str, Any]:
    try:
        val = jsonlimits.loads(text)
    except ValueError as exc:
        raise _UsageError(f"capability arguments are not valid JSON: {exc}") from None
    if not isinstance(val, dict):
        raise _UsageError("capability arguments must be a JSON object")
    return val


def parse_valid(items: list[str]) -> list[Attachment]:
    # lazy: the CNI runtime (and asyncio, ~45 ms) loads only for a verb that runs, not for --help
    from nri_cni.cni.runtime import Attachment

    out = []
    for item in items:
        cid, sep, ifname = item.partition("/")
        if not sep or not cid or not ifname or "/" in ifname:
            raise _UsageError(f"--valid wants CONTAINER_ID/IFNAME, got {item!r}")
        out.append(Attachment(container_id=cid, ifname=ifname))
    return out


def bin_dirs(args: argparse.Namespace) -> list[str]:
    if args.bin_dir:
        return list(args.bin_dir)
    env = os.environ.get("CNI_PATH", "")
    dirs = [d for d in env.split(":") if d]
    return dirs or [DEFAULT_BIN_DIR]


def load_network(args: argparse.Namespace) -> NetworkConfigList:
    """The NetworkConfigList named args.network (from --conflist or the conf dir)."""
    if args.conflist:
        net = load_conflist_file(args.conflist)
        if net.name != args.network:
            raise ConfigError(
                f"{args.conflist} defines network {net.name!r}, not {args.network!r}", location=args.conflist
            )
        return net
    confdir = args.conf_dir or os.environ.get("NETCONFPATH") or DEFAULT_CONF_DIR
    if not os.path.isdir(confdir):
        raise ConfigError(f"no net configurations found in {confdir}", location=confdir)
    nets, errors = load_conf_dir(confdir)
    for net in nets:
        if net.name == args.network:
            return net
    details = "; ".join(str(e) for e in errors)
    raise ConfigError(
        f"no net configuration with name {args.network!r} in {confdir}", location=confdir, details=details
    )


def runtime_conf(args: argparse.Namespace) -> RuntimeConf:
    # lazy: the CNI runtime (and asyncio, ~45 ms) loads only for a verb that runs, not for --help
    from nri_cni.cni.runtime import RuntimeConf

    netns = os.path.abspath(args.netns)
    cid = args.container_id or default_container_id(netns)
    ifname = args.ifname or os.environ.get("CNI_IFNAME") or "eth0"
    validate_ifname(ifname)
    cni_args_text = args.cni_args if args.cni_args is not None else os.environ.get("CNI_ARGS", "")
    cap_text = args.cap_args if args.cap_args is not None else os.environ.get("CAP_ARGS", "")
    return RuntimeConf(
        container_id=cid,
        netns=netns,
        ifname=ifname,
        args=args_option(cni_args_text) if cni_args_text else [],
        capability_args=parse_cap_args(cap_text) if cap_text else {},
    )


# --------------------------------------------------------------------------------------------
# the verbs


def _setup_logging(quiet: bool) -> None:
    import logging  # lazy: ~2.5 ms that every `nri-cni` command would pay at start

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("nri-cni: %(levelname)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.ERROR if quiet else logging.WARNING)
    logging.addLevelName(logging.WARNING, "warning")
    logging.addLevelName(logging.ERROR, "error")


def _handler(verb: str) -> Callable[[argparse.Namespace], int]:
    def handle(args: argparse.Namespace) -> int:
        _setup_logging(args.quiet)
        try:
            return _run(verb, args)
        except KeyboardInterrupt:
            raise
        except BaseException as exc:
            if isinstance(exc, SystemExit):
                raise
            return _report(exc)

    return handle


def _run(verb: str, args: argparse.Namespace) -> int:
    # lazy: the CNI runtime and asyncio (~45 ms) load only for a verb that runs, not for --help
    import asyncio

    from nri_cni.cni.exec import PluginExecutor
    from nri_cni.cni.runtime import CNIRuntime

    if verb == "version":
        rt = CNIRuntime(bin_dirs(args), exec_timeout=args.timeout, executor=PluginExecutor())
        answers = {t: asyncio.run(rt.version(t)) for t in args.plugins}
        out = answers[args.plugins[0]] if len(args.plugins) == 1 else answers
        print(json.dumps(out, indent=4))
        return EXIT_OK

    valid = parse_valid(args.valid) if verb == "gc" else []
    conf = runtime_conf(args) if verb in ("add", "check", "del") else None
    net = load_network(args)
    rt = CNIRuntime(
        bin_dirs(args), cache_dir=args.cache_dir, exec_timeout=args.timeout, executor=PluginExecutor()
    )
    if verb == "status":
        asyncio.run(rt.status(net))
        return EXIT_OK
    if verb == "gc":
        asyncio.run(rt.gc(net, valid))
        return EXIT_OK
    assert conf is not None  # add, check and del parsed it above

    if verb == "add":
        result = asyncio.run(rt.add(net, conf))
        rt.cache.flush()  # the entry on disk before this process ends
        print(json.dumps(result.to_dict(net.cni_version), indent=4))
    elif verb == "check":
        asyncio.run(rt.check(net, conf))
    elif verb == "del":
        asyncio.run(rt.delete(net, conf))
    else:  # pragma: no cover - register() only sets the verbs above
        raise AssertionError(verb)
    return EXIT_OK


def _report(exc: BaseException) -> int:
    """Print the CNI error object for `exc` on stderr; return the exit code for it."""
    if isinstance(exc, _UsageError):
        obj = {"cniVersion": CURRENT, "code": exc.code, "msg": exc.msg}
        code = EXIT_USAGE
    elif isinstance(exc, NriCniError):
        obj = exc.to_cni_error(CURRENT)
        if isinstance(exc, CNIError) and str(exc.ref):
            obj["details"] = f"{exc.ref}: {exc.details}" if exc.details else str(exc.ref)
        location = getattr(exc, "location", "")
        if location:
            obj["details"] = f"{location}: {obj['details']}" if obj.get("details") else location
        code = exit_code_for(exc)
    elif isinstance(exc, OSError):
        obj = {"cniVersion": CURRENT, "code": 5, "msg": str(exc)}  # I/O failure
        code = EXIT_FAILED
    else:
        obj = {"cniVersion": CURRENT, "code": 999, "msg": f"{type(exc).__name__}: {exc}"}
        code = EXIT_FAILED
    print(json.dumps(obj), file=sys.stderr)
    return code if code != EXIT_OK else EXIT_FAILED


__all__ = ["register", "default_container_id", "args_option"]
