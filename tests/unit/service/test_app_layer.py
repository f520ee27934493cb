"""The application layer's rules, without root, containerd or plugins: the modes' answers, the
error table, the cache seam, the shared local codec, and the daemon's start/stop stack."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import pytest

from nri_cni.cli.main import EXIT_FAILED, EXIT_PLUGIN, EXIT_UNAVAILABLE, EXIT_USAGE
from nri_cni.cni.cache import CacheEntry, ResultCache
from nri_cni.cni.nocache import NO_CACHE
from nri_cni.cni.runtime import CNIRuntime, RuntimeHooks
from nri_cni.config import parse_config
from nri_cni.daemon.app import build_daemon
from nri_cni.errors import (
    WIRE,
    AnnotationRefused,
    CniCode,
    CNIError,
    ConfigError,
    GrpcCode,
    Kind,
    NriCniError,
    PluginExecError,
    PluginNotRun,
    PluginTimeout,
    PodError,
    RPCError,
    Unavailable,
    exit_code_for,
)
from nri_cni.local import codec as localcodec
from nri_cni.local import proto as localproto
from nri_cni.pod.model import PodInfo, PrimaryNetwork
from nri_cni.service.modes import NativeMode, SecondaryMode, ShimMode, mode_for
from nri_cni.shim import render

ROOT = Path(__file__).resolve().parents[3]
NET = {"cniVersion": "1.1.0", "name": "podnet", "plugins": [{"type": "bridge"}]}


def _cfg(tmp_path: Path, mode: str, **extra) -> object:
    doc = {
        "mode": mode,
        "state_dir": str(tmp_path / "state"),
        "nri": {"socket": str(tmp_path / "nri.sock")},
        "daemon": {"socket": str(tmp_path / "daemon.sock")},
        "cni": {"cache_dir": str(tmp_path / "cache"), "runtime_cache_dir": str(tmp_path / "runtime")},
        "networks": [{"name": "podnet", "default": True, "conflist": NET}],
        "gc": {"interval": 0},
        "status": {"interval": 0},
        **extra,
    }
    return parse_config(doc, str(tmp_path / "config.yaml"))


# -- modes -------------------------------------------------------------------------------------


def test_each_mode_answers_the_questions_once(tmp_path):
    shim = mode_for(_cfg(tmp_path, "shim"))
    native = mode_for(_cfg(tmp_path, "native", primary_network="podnet"))
    secondary = mode_for(_cfg(tmp_path, "secondary", primary_network="cbr0"))
    assert (
        isinstance(shim, ShimMode) and isinstance(native, NativeMode) and isinstance(secondary, SecondaryMode)
    )
    flags = [
        (
            m.attaches_on_run,
            m.answers_run_pod,
            m.primary.ours,
            m.runtime_reports_our_ips,
            m.adds_behind_runtime,
        )
        for m in (shim, native, secondary)
    ]
    assert flags == [
        (False, False, True, True, True),
        (True, True, True, True, False),
        (True, False, False, False, True),
    ]
    assert native.primary == PrimaryNetwork("podnet", ours=True)
    pod = PodInfo("p" * 64, netns="/run/netns/x")
    assert shim.runtime_primary(pod) is None and native.runtime_primary(pod) is None


def test_secondary_mode_reads_the_runtime_primary_from_the_runtimes_cache(tmp_path):
    mode = mode_for(_cfg(tmp_path, "secondary", primary_network="cbr0"))
    pod = PodInfo("p" * 64, netns="/run/netns/x")
    assert mode.runtime_primary(pod) is not None
    assert mode.runtime_primary(pod).entry is None  # nothing cached yet: FINALIZE skips it
    ResultCache(str(tmp_path / "runtime")).write(
        CacheEntry(
            container_id=pod.id,
            ifname="eth0",
            network_name="cbr0",
            config=b"{}",
            result={"cniVersion": "1.1.0"},
        )
    )
    found = mode.runtime_primary(pod)
    assert found is not None and found.network == "cbr0" and found.entry is not None


MODE_NAMES = {"shim", "native", "secondary"}


def test_no_mode_name_is_compared_outside_the_modes_and_config_parsing():
    allowed = {
        ROOT / "nri_cni" / "service" / "modes.py",
        ROOT / "nri_cni" / "config" / "parse.py",
        ROOT / "nri_cni" / "config" / "model.py",
    }
    found = []
    for path in sorted((ROOT / "nri_cni").rglob("*.py")):
        if path in allowed or "api" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                parts = [node.left, *node.comparators]
                consts = [p for p in parts if isinstance(p, ast.Constant) and p.value in MODE_NAMES]
                consts += [
                    e
                    for p in parts
                    if isinstance(p, (ast.Tuple, ast.List, ast.Set))
                    for e in p.elts
                    if isinstance(e, ast.Constant) and e.value in MODE_NAMES
                ]
                if consts:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == []


# -- errors ------------------------------------------------------------------------------------


def test_every_kind_has_one_row_in_the_wire_table():
    assert set(WIRE) == set(Kind)


@pytest.mark.parametrize(
    ("exc", "kind", "cni", "grpc", "exit_code"),
    [
        (ConfigError("x"), Kind.CONFIG, CniCode.INVALID_CONFIG, GrpcCode.INVALID_ARGUMENT, EXIT_USAGE),
        (
            AnnotationRefused("x"),
            Kind.REFUSED,
            CniCode.INVALID_CONFIG,
            GrpcCode.PERMISSION_DENIED,
            EXIT_USAGE,
        ),
        (Unavailable("x"), Kind.UNAVAILABLE, CniCode.TRY_AGAIN_LATER, GrpcCode.UNAVAILABLE, EXIT_UNAVAILABLE),
        (CNIError(11, "busy"), Kind.PLUGIN_ERROR, 11, GrpcCode.UNKNOWN, EXIT_PLUGIN),  # its own code
        (PluginNotRun("x"), Kind.PLUGIN_NOT_RUN, CniCode.INTERNAL, GrpcCode.UNKNOWN, EXIT_PLUGIN),
        (PluginExecError("x"), Kind.PLUGIN_BROKEN, CniCode.INTERNAL, GrpcCode.UNKNOWN, EXIT_PLUGIN),
        (PluginTimeout("x"), Kind.PLUGIN_TIMEOUT, CniCode.INTERNAL, GrpcCode.DEADLINE_EXCEEDED, EXIT_PLUGIN),
        (RPCError(GrpcCode.NOT_FOUND, "x"), Kind.REMOTE, CniCode.INTERNAL, GrpcCode.NOT_FOUND, EXIT_FAILED),
        (NriCniError("x"), Kind.FAILED, CniCode.INTERNAL, GrpcCode.UNKNOWN, EXIT_FAILED),
        (
            NriCniError("x", kind=Kind.BAD_ENV),
            Kind.BAD_ENV,
            CniCode.INVALID_ENV,
            GrpcCode.INVALID_ARGUMENT,
            EXIT_USAGE,
        ),
        # a pod error is reported as its cause
        (
            PodError("pod x", cause=PluginTimeout("t")),
            Kind.PLUGIN_TIMEOUT,
            CniCode.INTERNAL,
            GrpcCode.DEADLINE_EXCEEDED,
            EXIT_PLUGIN,
        ),
    ],
)
def test_codes_come_from_the_kind(exc, kind, cni, grpc, exit_code):
    assert (exc.kind, exc.cni_code, exc.grpc_code, exit_code_for(exc)) == (kind, cni, grpc, exit_code)


def test_cli_modules_take_exit_codes_from_the_errors_not_from_the_cli():
    for path in (ROOT / "nri_cni" / "cli" / "cnitool.py", ROOT / "nri_cni" / "cli" / "daemon.py"):
        tree = ast.parse(path.read_text())
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert "nri_cni.cli.main" not in imported, path


# -- the cache seam ----------------------------------------------------------------------------


def test_with_no_cache_the_same_runtime_writes_nothing(tmp_path):
    hooks = RuntimeHooks()
    runtime = CNIRuntime([str(tmp_path)], str(tmp_path / "cache"), hooks=hooks)
    uncached = runtime.with_cache(NO_CACHE)
    assert (
        uncached.hooks is hooks
        and uncached.executor is runtime.executor
        and uncached.bin_dirs == runtime.bin_dirs
    )
    write = NO_CACHE.prepare(CacheEntry(container_id="c", ifname="eth0", network_name="n", config=b"{}"))
    write.prepare()
    write.commit({"cniVersion": "1.1.0"})
    assert NO_CACHE.read("n", "c", "eth0") is None and NO_CACHE.entries() == []
    assert not (tmp_path / "cache").exists()


# -- the local protocol ------------------------------------------------------------------------


def test_the_python_shim_carries_the_shared_codec_and_imports_nothing_of_the_package():
    text = render("/run/x.sock", python="/usr/bin/python3")
    codec = (ROOT / "nri_cni" / "local" / "codec.py").read_text()
    assert codec in text
    tree = ast.parse(text)
    imports = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    names = {a.name for n in imports if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module or "" for n in imports if isinstance(n, ast.ImportFrom)}
    assert names == {"_socket", "os", "sys"}


def test_server_and_clients_frame_alike():
    request = localproto.encode_request({"CNI_COMMAND": "DEL", "CNI_CONTAINERID": "c"}, b"{}")
    assert request == localcodec.encode_request([("CNI_COMMAND", "DEL"), ("CNI_CONTAINERID", "c")], b"{}")
    response = localproto.encode_response(1, b"err")
    assert localcodec.decode_response_head(response[: localcodec.RESPONSE_HEAD]) == (1, 3)
    with pytest.raises(localcodec.LocalProtocolError):
        localcodec.header_length((localcodec.MAX_HEADER + 1).to_bytes(4, "big"))


# -- the daemon's start/stop stack -------------------------------------------------------------


class _Part:
    def __init__(self, name: str, log: list[str], fail: bool = False) -> None:
        self.name, self.log, self.fail = name, log, fail

    async def start(self, *args) -> None:
        self.log.append(f"start {self.name}")
        if self.fail:
            raise OSError(f"{self.name} cannot start")

    async def close(self) -> None:
        self.log.append(f"close {self.name}")


def test_a_part_that_fails_to_start_stops_the_ones_before_it_in_reverse(tmp_path):
    daemon = build_daemon(_cfg(tmp_path, "native"))
    log: list[str] = []
    daemon.lifecycle = _Part("lifecycle", log)  # type: ignore[assignment]
    daemon.reloader = _Part("reloader", log)  # type: ignore[assignment]
    daemon.local = _Part("local", log, fail=True)  # type: ignore[assignment]

    async def flushed() -> None:
        with pytest.raises(OSError, match="local cannot start"):
            await daemon.run(handle_signals=False)

    asyncio.run(flushed())
    assert log == ["start lifecycle", "start reloader", "start local", "close reloader", "close lifecycle"]
    assert not daemon.stub.registered.is_set()  # never connected
