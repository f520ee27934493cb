"""CLI commands that run or ask the daemon: run, check-config, status, pods, gc, verify, install-shim."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from nri_cni.cli import health
from nri_cni.cni.config import load_finalize_dropins
from nri_cni.config import DEFAULT_CONFIG_PATH, DEFAULT_DAEMON_SOCKET, load_config, load_config_text
from nri_cni.errors import EXIT_FAILED, EXIT_USAGE, Kind, NriCniError, Unavailable

EMBEDDED_DEFAULT = "embedded default"


def register(sub) -> None:
    p = sub.add_parser("run", help="run the daemon (NRI plugin + shim server)")
    _config_arg(p)
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("check-config", help="validate a config file and the networks it loads")
    _config_arg(p)
    p.set_defaults(func=cmd_check_config)

    for name, help_text, func in (
        ("status", "the daemon's health: NRI connection, network STATUS, counts", cmd_status),
        ("pods", "pods and their networks, interfaces and IPs", cmd_pods),
        ("gc", "garbage-collect attachments of pods the runtime no longer has", cmd_gc),
    ):
        p = sub.add_parser(name, help=help_text)
        p.add_argument(
            "--socket",
            default=os.environ.get("NRI_CNI_SOCKET", DEFAULT_DAEMON_SOCKET),
            help="the daemon's local socket (default: %(default)s)",
        )
        p.add_argument("-o", "--output", choices=("table", "json"), default="table")
        p.set_defaults(func=func)
        if name == "status":
            p.add_argument(
                "--watch",
                "-w",
                type=float,
                nargs="?",
                const=2.0,
                default=None,
                metavar="SECONDS",
                help="ask again every SECONDS (default 2) and print the report when it changes",
            )
            p.add_argument(
                "--ping",
                action="store_true",
                help="only whether the daemon answers (a liveness probe): exit 0, or 2 if it does not",
            )

    p = sub.add_parser(
        "verify",
        help="verify pods' networks against the node now (netlink; --check: the chains' CNI CHECK too)",
        description="Exit 0: every pod ok or repaired; 1: a pod is broken; 2: no answer or an error.",
    )
    p.add_argument(
        "--socket",
        default=os.environ.get("NRI_CNI_SOCKET", DEFAULT_DAEMON_SOCKET),
        help="the daemon's local socket (default: %(default)s)",
    )
    p.add_argument(
        "--pod", default=None, metavar="ID", help="one pod: its id, an id prefix, or namespace/name"
    )
    p.add_argument("--check", action="store_true", help="run each chain's CNI CHECK as well")
    p.add_argument(
        "--kinds",
        action="store_true",
        help="list every finding and broken code verify reports: what it means, how soon it is "
        "noticed, what repair does, what an admin does (asks the daemon nothing)",
    )
    p.add_argument("-o", "--output", choices=("table", "json"), default="table")
    p.set_defaults(func=cmd_verify)

    p = sub.add_parser("install-shim", help="write the nri-cni-shim CNI plugin into a CNI bin dir")
    p.add_argument("dest", nargs="?", default="/opt/cni/bin")
    p.add_argument(
        "--socket",
        default=DEFAULT_DAEMON_SOCKET,
        help="the daemon socket the shim calls by default (default: %(default)s)",
    )
    p.add_argument(
        "--python",
        default=None,
        help="the interpreter the shim runs with, as the node sees it (default: this "
        "one; a DaemonSet's init container names the host's)",
    )
    build = p.add_mutually_exclusive_group()
    build.add_argument(
        "--compiled",
        dest="compiled",
        action="store_true",
        default=None,
        help="build the C shim (~1 ms per call; needs cc); the default when cc exists",
    )
    build.add_argument(
        "--script",
        dest="compiled",
        action="store_false",
        help="write the Python shim (~9 ms per call; no compiler needed)",
    )
    p.set_defaults(func=cmd_install_shim)


def _config_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        "-c",
        default=None,
        help=f"YAML config (default: {DEFAULT_CONFIG_PATH} if it exists, else the {EMBEDDED_DEFAULT})",
    )


def load(args):
    from importlib import resources  # lazy: ~4 ms, for the embedded default config alone

    path = args.config
    if path is None and os.path.exists(DEFAULT_CONFIG_PATH):
        path = DEFAULT_CONFIG_PATH
    if path is not None:
        return load_config(path)
    text = resources.files("nri_cni").joinpath("data/default-config.yaml").read_text()
    return load_config_text(text, f"<{EMBEDDED_DEFAULT}>", base_dir="/")


def cmd_run(args) -> int:
    # lazy: the daemon's whole tree (~100 ms) loads for `nri-cni run` alone
    import asyncio

    from nri_cni.cli.gctune import tune_gc
    from nri_cni.cli.logsetup import setup_logging
    from nri_cni.cli.threadtune import tune_threads
    from nri_cni.daemon.app import build_daemon

    cfg = load(args)
    setup_logging(cfg.log_level, cfg.log_format)
    # plugins start in "/" whatever directory the daemon was started from; the
    # config's relative paths were resolved against its own directory already
    os.chdir("/")
    daemon = build_daemon(cfg)
    tune_gc()  # after the imports and the config: that heap is never collected again
    tune_threads()
    asyncio.run(daemon.run())
    return 0


def cmd_check_config(args) -> int:

    cfg = load(args)
    print(f"{cfg.path}: ok ({cfg.mode} mode)")
    for net in cfg.networks:
        kinds = " ".join(p.type for p in net.conflist.plugins)
        fin = " ".join(p.type for p in net.conflist.finalize_plugins)
        who = "every pod" if net.default else f"on request in {', '.join(net.namespaces) or 'no namespace'}"
        print(
            f"  network {net.name}: cniVersion {net.conflist.cni_version}, plugins [{kinds}]"
            + (f", finalize [{fin}]" if fin else "")
            + f", {who}"
            + (f" (NetworkAttachmentDefinition {net.nad}, {net.conflist.source})" if net.nad else "")
        )
    if cfg.nad_dir:
        count = sum(1 for n in cfg.networks if n.nad)
        print(f"  NetworkAttachmentDefinitions from {cfg.nad_dir}: {count}")
    # FINALIZE drop-ins: <conf dir>/_finalize.d/*.conf, run for every network after its own
    finalize_dir = cfg.cni.finalize_dir.rstrip("/")
    plugins, errors = load_finalize_dropins(os.path.dirname(finalize_dir))
    if plugins:
        print(
            f"  finalize drop-ins from {finalize_dir}, for every network: [{' '.join(p.type for p in plugins)}]"
        )
    else:
        print(f"  finalize drop-ins: none in {finalize_dir}")
    for err in errors:
        print(f"nri-cni: {err}", file=sys.stderr)
    return EXIT_USAGE if errors else 0


def _ask(args, op: str):
    # lazy: the local protocol's asyncio (~25 ms) only for the commands that ask the daemon
    from nri_cni.local import proto

    status, payload = proto.call(args.socket, {proto.OP_KEY: op})
    data = json.loads(payload or b"null")
    if status != 0:
        print(f"nri-cni: {data.get('error', data)}", file=sys.stderr)
        return EXIT_FAILED, None
    return 0, data


def _report(args, op: str, show_table, ok=lambda data: True) -> int:
    """Asks the daemon; prints JSON (-o json) or `show_table(data)`; exit 1 unless ok(data)."""
    code, data = _ask(args, op)
    if code:
        return code
    if args.output == "json":
        print(json.dumps(data, indent=2))
    else:
        show_table(data)
    return 0 if ok(data) else EXIT_FAILED


def cmd_status(args) -> int:
    """Exit 0 ready, 1 degraded, 2 not ready or unreachable (nri_cni/cli/health.py)."""
    if args.ping:
        return _ping(args)
    if args.watch is None:
        return _status_once(args)[0]
    last = None
    code = 2
    try:
        while True:
            code, text = _status_once(args, quiet=True)
            if text != last:
                if args.output == "table":
                    print(f"--- {time.strftime('%Y-%m-%dT%H:%M:%S')} {health_name(code)}")
                print(text, flush=True)
                last = text
            time.sleep(max(0.1, args.watch))
    except KeyboardInterrupt:
        return code


def _unreachable(exc: BaseException) -> bool:
    """The daemon is not there (nothing listens, or it went away): read by the error's kind."""
    return isinstance(exc, OSError) or (isinstance(exc, NriCniError) and exc.kind is Kind.UNAVAILABLE)


def _ping(args) -> int:
    from nri_cni.local import proto  # lazy: the local protocol's asyncio (~25 ms)

    try:
        status, _ = proto.call(args.socket, {proto.OP_KEY: "status"}, timeout=10.0)
    except (NriCniError, OSError) as exc:
        if not _unreachable(exc):
            raise
        print(f"nri-cni: {exc}", file=sys.stderr)
        return health.NOT_READY
    print("nri-cni: the daemon answers")
    return health.READY if status == 0 else health.NOT_READY


def health_name(code: int) -> str:
    return health.NAMES[code]


def _status_once(args, quiet: bool = False) -> tuple[int, str]:
    """(exit code, what to print). Unreachable is `not ready` for a probe: exit 2."""
    from nri_cni.local import proto  # lazy: the local protocol's asyncio (~25 ms)

    try:
        status, payload = proto.call(args.socket, {proto.OP_KEY: "status"}, timeout=10.0)
        data = json.loads(payload or b"null")
        if status != 0:
            raise Unavailable(str(data.get("error", data)))
    except (NriCniError, OSError, ValueError) as exc:
        if not isinstance(exc, ValueError) and not _unreachable(exc):
            raise
        verdict = health.unreachable(f"nri-cni: {exc}")
        text = json.dumps({"health": verdict.name, "reasons": verdict.reasons}, indent=None if quiet else 2)
        if args.output == "table":
            text = f"health:     {verdict.line()}"
        if not quiet:
            print(text, file=sys.stderr if args.output == "table" else sys.stdout)
        return verdict.code, text
    verdict = health.assess(data)
    if args.output == "json":
        data = {**data, "health": verdict.name, "reasons": verdict.reasons}
        if quiet:  # --watch: one JSON line per change, and the uptime is no change
            data.pop("uptimeSeconds", None)
            data["verify"] = {"verified": (data.get("verify") or {}).get("verified", False)}  # nor a round
        text = json.dumps(data, indent=None if quiet else 2)
    else:
        text = _status_table(data, verdict, watch=quiet)
    if not quiet:
        print(text)
    return verdict.code, text


def _status_table(data, verdict, watch: bool = False) -> str:
    nri = data["nri"]
    lines = [
        f"mode:       {data['mode']}",
        f"ready:      {'yes' if data['ready'] else 'NO'}",
        f"health:     {verdict.line()}",
        f"runtime:    {nri['runtime'] or '-'} (registered: {nri['registered']}, "
        f"synchronized: {nri['synchronized']})",
        f"pods:       {data['pods']}  attachments: {data['attachments']}",
    ]
    for name, st in data["networks"].items():
        state = "ready" if st["ready"] else f"NOT READY: {st['error']}"
        lines.append(f"network {name}: {state}")
    for name, lc in (data.get("lifecycle") or {}).items():
        for old in lc.get("retired", []):
            lines.append(
                f"network {name}: generation {old['generation']} retired, "
                f"{old['attachments']} attachment(s) left, DEINIT {old['state']}"
                + (f": {old['error']}" if old["error"] else "")
            )
    lines.append(f"verify:     {_verify_line(data.get('verify') or {}, data.get('podStates') or {}, watch)}")
    for pod in data.get("broken") or ():
        label = f"{pod['namespace']}/{pod['name']}" if pod.get("name") else pod["pod"][:12]
        lines.append(f"broken pod {label}: {pod['code']}: {pod['reason']}")
    reload = data.get("reload") or {}
    if reload.get("refused"):
        lines.append(f"config reload REFUSED (running config kept): {reload['refused']}")
    return "\n".join(lines)


def _verify_line(rounds, states, watch: bool = False) -> str:
    """The verify rounds; --watch leaves out the last round's time (each round is no change)."""
    if not rounds.get("verified"):
        return "not verified yet (no verify round finished since the start)"
    counts = ", ".join(f"{n} {state}" for state, n in states.items() if n) or "no pod"
    if watch:
        return f"verified: {counts}"
    at = time.strftime("%H:%M:%S", time.localtime(rounds["lastRound"]))
    return f"verified: {counts}; last round {at}, {rounds['lastRoundSeconds']:.3f} s ({rounds['rounds']} round(s))"


def cmd_pods(args) -> int:
    from nri_cni.cli.tables import pods_table  # lazy: only `pods` prints it

    return _report(args, "pods", lambda data: print(pods_table(data, time.time())))


def cmd_gc(args) -> int:
    return _report(args, "gc", _gc_table, ok=lambda data: not data["errors"])


def _gc_table(data) -> None:
    print(f"deleted {len(data['deleted'])} attachment(s)")
    for err in data["errors"]:
        print(f"error: {err}", file=sys.stderr)


def cmd_verify(args) -> int:
    """Exit 0 all ok or repaired, 1 a pod broken, 2 the daemon unreachable or the verify failed
    (as `nri-cni status`: 2 is "cannot say")."""
    if args.kinds:
        from nri_cni.cli.findings import kinds_table  # lazy: the report's cache and result parsers

        print(kinds_table())
        return 0
    from nri_cni.local import proto  # lazy: the local protocol's asyncio (~25 ms)

    body = json.dumps({"pod": args.pod, "check": args.check}).encode()
    try:
        status, payload = proto.call(args.socket, {proto.OP_KEY: "verify"}, body)
        data = json.loads(payload or b"null")
    except (NriCniError, OSError, ValueError) as exc:
        print(f"nri-cni: {exc}", file=sys.stderr)
        return health.NOT_READY
    if status != 0 or not isinstance(data, list):
        print(
            f"nri-cni: verify failed: {data.get('error', data) if isinstance(data, dict) else data}",
            file=sys.stderr,
        )
        return health.NOT_READY
    if args.output == "json":
        print(json.dumps(data, indent=2))
    else:
        from nri_cni.cli.tables import verify_table  # lazy: only `verify` prints it

        print(verify_table(data))
    return EXIT_FAILED if any(v["state"] == "broken" for v in data) else 0


def cmd_install_shim(args) -> int:
    from nri_cni.shim import install  # lazy: the installer's subprocess and tempfile (~20 ms)

    print(install(args.dest, args.socket, python=args.python, compiled=args.compiled))
    return 0
