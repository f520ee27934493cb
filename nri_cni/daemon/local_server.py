"""The daemon side of the local socket: CNI calls forwarded by `nri-cni-shim`, and CLI requests.

A shim call is a CNI invocation of the runtime's only network. nri-cni turns it into the pod's
whole plan: ADD attaches every network the pod gets and answers with the primary network's
result (converted to the shim's cniVersion), so the runtime and kubelet see nri-cni's IP through
today's CNI path; DEL detaches all of them; CHECK checks all; STATUS reports the daemon's health;
GC converges on the attachments the runtime says are valid.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Callable
from typing import Any

from nri_cni.config import Config
from nri_cni.daemon.reports import DaemonReports
from nri_cni.errors import ConfigError, Kind, NriCniError
from nri_cni.local import guard, proto
from nri_cni.pod.model import AttachRequest, PodInfo
from nri_cni.pod.oprecord import arrival
from nri_cni.safety import files, jsonlimits, validate
from nri_cni.service.readiness import NetworkReadiness
from nri_cni.service.service import PodService

log = logging.getLogger("nri_cni.local")

POD_ANNOTATIONS_CAP = "io.kubernetes.cri.pod-annotations"
MAX_POD_ARG = 512  # `nri-cni verify --pod`: an id, a prefix or namespace/name (253 + 1 + 253)


class LocalServer:
    def __init__(
        self,
        path: str,
        *,
        pods: PodService,
        readiness: NetworkReadiness,
        reports: DaemonReports,
        observe_shim: Callable[[str, float], None] | None = None,
        closed: Callable[[], None] | None = None,
    ) -> None:
        """observe_shim(verb, seconds): each shim request answered, how long the runtime's CNI
        call waited on the daemon; closed(): each connection closed (its transport is a
        reference cycle: nri_cni/daemon/cycles.py)."""
        self.pods = pods
        self.observe_shim = observe_shim
        self.closed = closed
        self.readiness = readiness
        self.reports = reports
        self.path = path
        self._server: asyncio.base_events.Server | None = None
        # peer credentials, connection cap, read timeout, size cap (nri_cni/local/guard.py)
        self.guard = guard.LocalGuard(lambda: _guard_settings(self.pods.cfg))

    async def start(self) -> None:
        files.restrict_umask()  # the socket is created 0700 by bind: no window before the chmod
        os.makedirs(os.path.dirname(self.path) or ".", mode=0o755, exist_ok=True)
        try:
            os.unlink(self.path)  # left by a previous run
        except FileNotFoundError:
            pass
        self._server = await asyncio.start_unix_server(self._serve, path=self.path)
        # root only (the shim runs as root inside the runtime), or the allowed group
        guard.grant_socket(self.path, self.pods.cfg.local.allowed_gids)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        stamps = {"accepted": time.perf_counter()}  # the pod operation's record shows them
        arrival(stamps)
        try:
            if self.guard.admit(writer):
                await self._answer(reader, writer, stamps)
        finally:
            writer.close()
            if self.closed is not None:
                self.closed()

    async def _answer(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, stamps: dict[str, float]
    ) -> None:
        try:
            try:
                header, body = await self.guard.read(reader)
                stamps["read"] = time.perf_counter()
            except proto.LocalProtocolError as exc:
                self.guard.refusals("malformed", "local socket: malformed request: %s", exc)
                return
            op = header.get(proto.OP_KEY)
            if op is None:
                t0 = time.perf_counter()
                try:
                    status, payload = await self._cni_call(header, body, stamps)
                finally:
                    if self.observe_shim is not None:
                        self.observe_shim(str(header.get("CNI_COMMAND", "")), time.perf_counter() - t0)
            else:
                status, payload = await self._cli_call(op, body)
            writer.write(proto.encode_response(status, payload))
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the shim was killed (runtime timeout); the work itself is finished regardless
        finally:
            self.guard.release()

    # -- shim --------------------------------------------------------------------------------

    async def _cni_call(
        self, env: dict[str, str], stdin: bytes, stamps: dict[str, float]
    ) -> tuple[int, bytes]:
        version = "1.0.0"
        try:
            try:
                conf = jsonlimits.loads(stdin or b"{}")
            except ValueError as exc:
                raise NriCniError(
                    "the network config on stdin is not JSON",
                    details=str(exc),
                    kind=Kind.UNDECODABLE,
                ) from None
            if not isinstance(conf, dict):
                raise NriCniError("the network config must be a JSON object", kind=Kind.UNDECODABLE)
            version = validate.cni_version(conf.get("cniVersion"), version)
            if not isinstance(conf.get("runtimeConfig") or {}, dict):
                raise NriCniError("runtimeConfig must be a JSON object", kind=Kind.UNDECODABLE)
            command = env.get("CNI_COMMAND", "")
            if command == "STATUS":
                self.readiness.check()
                return 0, b""
            if command == "GC":
                await self._gc(conf)
                return 0, b""
            pod = self._pod_from_env(env, conf)
            stamps["decoded"] = time.perf_counter()
            if command == "ADD":
                runtime_caps = dict(conf.get("runtimeConfig") or {})
                runtime_caps.pop(POD_ANNOTATIONS_CAP, None)
                ifname = validate.check_ifname(env.get("CNI_IFNAME", "eth0"))
                answer = await self.pods.verbs.attach(
                    pod, AttachRequest(runtime_caps, primary_ifname=ifname, first_answered=True)
                )
                primary = answer.attachments[0].result
                return 0, json.dumps(primary.to_dict(version)).encode()
            if command == "DEL":
                await self.pods.verbs.detach(pod)
                return 0, b""
            if command == "CHECK":
                await self.pods.verbs.check(pod, validate.check_ifname(env.get("CNI_IFNAME", "eth0")))
                return 0, b""
            raise NriCniError(f"unsupported CNI_COMMAND {validate.quote(command)}", kind=Kind.BAD_ENV)
        except NriCniError as exc:
            cid = env.get("CNI_CONTAINERID", "?")
            shown = cid if validate.is_valid_id(cid) else validate.quote_whole(cid)
            log.error("shim %s for %s: %s", validate.quote(env.get("CNI_COMMAND", "?"), 20), shown, exc)
            return 1, json.dumps(_cni_error(exc, version)).encode()
        except Exception as exc:  # no input may end a request without an answer
            log.exception("shim %s: unexpected error", validate.quote(env.get("CNI_COMMAND", "?"), 20))
            err = NriCniError("internal error", details=validate.quote(repr(exc)))
            return 1, json.dumps(_cni_error(err, version)).encode()

    @staticmethod
    def _pod_from_env(env: dict[str, str], conf: dict[str, Any]) -> PodInfo:
        cid = validate.check_id(env.get("CNI_CONTAINERID", ""), "CNI_CONTAINERID")
        args = dict(validate.cni_args_pairs(env.get("CNI_ARGS", "")))  # a key given twice: its last value
        annotations = (conf.get("runtimeConfig") or {}).get(POD_ANNOTATIONS_CAP) or {}
        if not isinstance(annotations, dict):
            raise ConfigError(f"runtimeConfig.{POD_ANNOTATIONS_CAP} must be an object")
        return PodInfo(
            id=cid,
            name=args.get("K8S_POD_NAME", ""),
            namespace=args.get("K8S_POD_NAMESPACE", ""),
            uid=args.get("K8S_POD_UID", ""),
            netns=env.get("CNI_NETNS", ""),
            annotations={str(k): str(v) for k, v in annotations.items()},
        )

    async def _gc(self, conf: dict[str, Any]) -> None:
        """The runtime's own GC of the shim's network: its valid attachments are its pods."""
        pod_ids = validate.gc_valid_ids(conf)
        report = await self.pods.timers.gc_listed(pod_ids)
        if report["errors"]:
            raise NriCniError(
                f"GC left {len(report['errors'])} error(s), retried by the next GC",
                details="; ".join(report["errors"]),
            )

    # -- CLI ---------------------------------------------------------------------------------

    async def _cli_call(self, op: str, body: bytes) -> tuple[int, bytes]:
        try:
            if op == "status":
                payload: object = self.reports.status()
            elif op == "pods":
                payload = self.reports.pods()
            elif op == "gc":
                payload = await self.pods.timers.gc(reason="requested by the CLI")
            elif op == "verify":
                pod_id, check = _verify_args(body)
                payload = await self.reports.verify(pod_id, check=check)
            else:
                return 1, json.dumps({"error": f"unknown operation {op!r}"}).encode()
        except NriCniError as exc:
            return 1, json.dumps({"error": str(exc)}).encode()
        return 0, json.dumps(payload).encode()


def _verify_args(body: bytes) -> tuple[str | None, bool]:
    """`nri-cni verify`'s request: {"pod": id or null, "check": bool}."""
    try:
        args = jsonlimits.loads(body or b"{}")
    except ValueError as exc:
        raise NriCniError(
            "verify: the request is not JSON", details=str(exc), kind=Kind.UNDECODABLE
        ) from None
    if not isinstance(args, dict):
        raise NriCniError("verify: the request must be a JSON object", kind=Kind.UNDECODABLE)
    pod = args.get("pod")
    if pod is not None and not (isinstance(pod, str) and 0 < len(pod) <= MAX_POD_ARG):
        raise NriCniError("verify: pod must be a pod id, an id prefix or namespace/name")
    return pod, args.get("check") is True


def _cni_error(exc: NriCniError, version: str) -> dict[str, Any]:
    out = exc.to_cni_error(version)
    out["msg"] = validate.cap_text(str(out.get("msg", "")))
    if out.get("details"):
        out["details"] = validate.cap_text(str(out["details"]))
    # The message a kubelet event shows: the whole chain, not just the outer layer.
    if not out.get("details"):
        out.pop("details", None)
    return out


def _guard_settings(cfg: Config) -> guard.GuardSettings:
    local = cfg.local
    return guard.GuardSettings(
        allowed_uids=local.allowed_uids,
        allowed_gids=local.allowed_gids,
        max_connections=local.max_connections,
        read_timeout=local.read_timeout,
        max_request_bytes=local.max_request_bytes,
    )
