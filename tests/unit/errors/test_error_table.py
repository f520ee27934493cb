"""One error table: every kind has one row, and an error's CNI code, gRPC status and exit code
all come from its kind (a pod error is reported as its cause); the CLI modules take their exit
codes from the errors, not from the CLI's root."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from nri_cni.cli.main import EXIT_FAILED, EXIT_PLUGIN, EXIT_UNAVAILABLE, EXIT_USAGE
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

ROOT = Path(__file__).resolve().parents[3]


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
