"""CLI commands that run or ask the daemon: run, check-config, status, pods, gc, install-shim."""

from __future__ import annotations

import argparse
import json
import os
import sys

from nri_cni.config import DEFAULT_CONFIG_PATH, DEFAULT_DAEMON_SOCKET, load_config, load_config_text
from nri_cni.errors import EXIT_FAILED

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

    from nri_cni.daemon.app import build_daemon
    from nri_cni.gctune import tune_gc
    from nri_cni.logsetup import setup_logging

    cfg = load(args)
    setup_logging(cfg.log_level, cfg.log_format)
    # plugins start in "/" whatever directory the daemon was started from (issue 15); the
    # config's relative paths were resolved against its own directory already
    os.chdir("/")
    daemon = build_daemon(cfg)
    tune_gc()  # after the imports and the config: that heap is never collected again
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
        )
    return 0


def _ask(args, op: str):
    # lazy: the local protocol's asyncio (~25 ms) only for the commands that ask the daemon
    from nri_cni import localproto

    status, payload = localproto.call(args.socket, {localproto.OP_KEY: op})
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
    return _report(args, "status", _status_table, ok=lambda data: data["ready"])


def _status_table(data) -> None:
    nri = data["nri"]
    print(f"mode:       {data['mode']}")
    print(f"ready:      {'yes' if data['ready'] else 'NO'}")
    print(
        f"runtime:    {nri['runtime'] or '-'} (registered: {nri['registered']}, "
        f"synchronized: {nri['synchronized']})"
    )
    print(f"pods:       {data['pods']}  attachments: {data['attachments']}")
    for name, st in data["networks"].items():
        state = "ready" if st["ready"] else f"NOT READY: {st['error']}"
        print(f"network {name}: {state}")
    for name, lc in (data.get("lifecycle") or {}).items():
        for old in lc.get("retired", []):
            print(
                f"network {name}: generation {old['generation']} retired, "
                f"{old['attachments']} attachment(s) left, DEINIT {old['state']}"
                + (f": {old['error']}" if old["error"] else "")
            )
    reload = data.get("reload") or {}
    if reload.get("refused"):
        print(f"config reload REFUSED (running config kept): {reload['refused']}")


def cmd_pods(args) -> int:
    return _report(args, "pods", _pods_table)


def _pods_table(data) -> None:
    rows = [("POD", "NETWORK", "INTERFACE", "IPS", "MAC")]
    for pod in data:
        label = f"{pod['namespace']}/{pod['name']}" if pod["name"] else pod["id"][:12]
        for i, net in enumerate(pod["networks"]):
            rows.append(
                (
                    label if i == 0 else "",
                    net["network"],
                    net["interface"],
                    ",".join(net["ips"]) or "-",
                    net["mac"] or "-",
                )
            )
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())


def cmd_gc(args) -> int:
    return _report(args, "gc", _gc_table, ok=lambda data: not data["errors"])


def _gc_table(data) -> None:
    print(f"deleted {len(data['deleted'])} attachment(s)")
    for err in data["errors"]:
        print(f"error: {err}", file=sys.stderr)


def cmd_install_shim(args) -> int:
    from nri_cni.shim import install  # lazy: the installer's subprocess and tempfile (~20 ms)

    print(install(args.dest, args.socket, python=args.python, compiled=args.compiled))
    return 0
