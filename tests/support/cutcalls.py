"""The calls a churn lost, each put down to its cause (for the churn of tests/support/faultnode.py).

A CRI call that fails while the test has the runtime down is expected: the runtime's process was
not the same from the call's start to its end (killed, stopped, started again: its PID changed
or there was none), or its socket did not answer (gRPC UNAVAILABLE: nothing listening yet, or
the connection dropped as it died). Any other failure, a CNI or NRI error from nri-cni, a
deadline, while the same runtime process ran throughout, is a failure that fails the test.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc

T = TypeVar("T")
RUNTIME_DOWN = (grpc.StatusCode.UNAVAILABLE,)


def _code(exc: BaseException) -> grpc.StatusCode | None:
    code = getattr(exc, "code", None)
    if isinstance(exc, grpc.RpcError) and callable(code):
        try:
            return code()
        except Exception:  # an RpcError without a status: nothing to tell by
            return None
    return None


@dataclass
class CutCalls:
    """`call(what, fn, *args)` runs one CRI call; a failure is classified and recorded, then raised."""

    runtime_pid: Callable[[], Any]  # the runtime's PID now (None while it is down)
    lock: threading.Lock = field(default_factory=threading.Lock)
    expected: list[str] = field(default_factory=list)  # cut while the runtime was down
    failures: list[str] = field(default_factory=list)  # anything else

    def call(self, what: str, fn: Callable[..., T], *args: Any, **kw: Any) -> T:
        before = self.runtime_pid()
        try:
            return fn(*args, **kw)
        except Exception as exc:
            after = self.runtime_pid()
            down = before is None or after is None or before != after or _code(exc) in RUNTIME_DOWN
            line = f"{what}: {type(exc).__name__} {_code(exc)}: {str(exc)[:300]}"
            with self.lock:
                (self.expected if down else self.failures).append(line)
            raise

    def summary(self) -> str:
        return (
            f"{len(self.expected)} call(s) cut while the runtime was down or restarting, "
            f"{len(self.failures)} failed while it was up"
        )

    def assert_no_failures(self) -> None:
        """Every failed call is put down to the runtime being down; any other fails the test."""
        print(f"churn: {self.summary()}")
        assert not self.failures, self.summary() + ":\n  " + "\n  ".join(self.failures[:20])


def cri_refused(fn: Callable[..., Any], *args: Any, **kw: Any) -> grpc.RpcError:
    """`fn(*args)`, a CRI call, must fail with the runtime's answer: a gRPC error that is no
    deadline (a call that hung until its timeout is not the refusal a test expects)."""
    try:
        fn(*args, **kw)
    except grpc.RpcError as exc:
        assert _code(exc) is not grpc.StatusCode.DEADLINE_EXCEEDED, f"a timeout, not a refusal: {exc}"
        return exc
    raise AssertionError(f"{getattr(fn, '__name__', fn)} succeeded; it should have been refused")
