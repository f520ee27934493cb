"""A small typed CRI client for the end-to-end tests.

The CRI ``api.proto`` (Debian's golang-k8s-cri-api-dev, extracted under
``$NRI_CNI_DEPS/root``) is compiled with grpc_tools at test time into
``<repo>/.cache/cri/<key>/`` and loaded from there; nothing generated is checked in.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CACHE = REPO_ROOT / ".cache"
CRI_PROTO_REL = "root/usr/share/gocode/src/k8s.io/cri-api/pkg/apis/runtime/v1/api.proto"
# The generated modules get a name of their own so they cannot clash with another api_pb2.
MODULE_STEM = "nct_cri_api_v1"


def deps_prefix() -> Path:
    return Path(os.environ.get("NRI_CNI_DEPS", "/opt/nri-cni-deps"))


def cri_proto_path() -> Path:
    return deps_prefix() / CRI_PROTO_REL


@dataclass(frozen=True)
class CriModules:
    pb2: ModuleType  # messages
    grpc: ModuleType  # RuntimeServiceStub, ImageServiceStub


_GOGO_IMPORT = re.compile(r'^\s*import\s+(public\s+)?"github\.com/gogo/[^"]*";\s*$', re.M)
_GOGO_FILE_OPTION = re.compile(r"^\s*option\s+\(gogoproto\.[^)]*\)\s*=\s*[^;]*;\s*$", re.M)
_GOGO_FIELD_OPTIONS = re.compile(r"\s*\[\s*\(gogoproto\.[^\]]*\]")


def preprocess_proto(text: str) -> str:
    """Drop gogoproto imports and options (older CRI protos carry them; protoc lacks gogo.proto)."""
    text = _GOGO_IMPORT.sub("", text)
    text = _GOGO_FILE_OPTION.sub("", text)
    return _GOGO_FIELD_OPTIONS.sub("", text)


def _load_module(name: str, path: Path) -> ModuleType:
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


_compiled: CriModules | None = None


def compile_cri(cache_dir: Path | None = None, proto: Path | None = None) -> CriModules:
    """Compile (or reuse) the CRI proto and import the generated modules."""
    global _compiled
    if _compiled is not None:
        return _compiled
    import google.protobuf
    from grpc_tools import protoc  # imported late: only needed for the first compile

    proto = Path(proto) if proto is not None else cri_proto_path()
    if not proto.is_file():
        raise FileNotFoundError(
            f"CRI api.proto not found at {proto} (run .ci/install-deps, or set NRI_CNI_DEPS)"
        )
    source = preprocess_proto(proto.read_text())
    key = hashlib.sha256(
        "\0".join([source, grpc.__version__, google.protobuf.__version__]).encode()
    ).hexdigest()[:16]
    cache_dir = Path(cache_dir) if cache_dir is not None else DEFAULT_CACHE
    final = cache_dir / "cri" / key
    pb2_path = final / f"{MODULE_STEM}_pb2.py"
    grpc_path = final / f"{MODULE_STEM}_pb2_grpc.py"
    if not grpc_path.is_file():
        final.parent.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=final.parent))
        try:
            (work / f"{MODULE_STEM}.proto").write_text(source)
            include = Path(protoc.__file__).parent / "_proto"
            rc = protoc.main(
                [
                    "grpc_tools.protoc",
                    f"-I{work}",
                    f"-I{include}",
                    f"--python_out={work}",
                    f"--grpc_python_out={work}",
                    str(work / f"{MODULE_STEM}.proto"),
                ]
            )
            if rc != 0:
                raise RuntimeError(f"protoc failed ({rc}) on {proto}")
            (work / f"{MODULE_STEM}.proto").unlink()
            try:
                os.rename(work, final)
            except OSError:
                if not grpc_path.is_file():
                    raise
        finally:
            shutil.rmtree(work, ignore_errors=True)
    pb2 = _load_module(f"{MODULE_STEM}_pb2", pb2_path)
    grpc_mod = _load_module(f"{MODULE_STEM}_pb2_grpc", grpc_path)
    _compiled = CriModules(pb2=pb2, grpc=grpc_mod)
    return _compiled


@dataclass(frozen=True)
class PortMapping:
    container_port: int
    host_port: int = 0
    protocol: str = "TCP"  # TCP, UDP, SCTP
    host_ip: str = ""


@dataclass(frozen=True)
class VersionInfo:
    version: str
    runtime_name: str
    runtime_version: str
    runtime_api_version: str


@dataclass(frozen=True)
class PodInfo:
    id: str
    name: str
    namespace: str
    uid: str
    state: str  # "SANDBOX_READY" / "SANDBOX_NOTREADY"
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)

    @property
    def ready(self) -> bool:
        return self.state == "SANDBOX_READY"


@dataclass(frozen=True)
class PodStatus:
    id: str
    name: str
    namespace: str
    uid: str
    state: str  # "SANDBOX_READY" / "SANDBOX_NOTREADY"
    ip: str  # PodSandboxStatus.network.ip ("" when none)
    additional_ips: tuple[str, ...]
    netns_path: str | None  # from the verbose info, when the runtime gives it
    info: dict[str, Any]  # the verbose info, JSON values decoded
    annotations: dict[str, str] = field(default_factory=dict)

    @property
    def ready(self) -> bool:
        return self.state == "SANDBOX_READY"

    @property
    def ips(self) -> tuple[str, ...]:
        return ((self.ip,) if self.ip else ()) + self.additional_ips


def _netns_from_info(info: Mapping[str, Any]) -> str | None:
    """containerd's verbose ``info`` holds the sandbox's OCI spec; its network namespace
    entry names the netns path."""
    data = info.get("info")
    if not isinstance(data, Mapping):
        return None
    spec = data.get("runtimeSpec") or {}
    for ns in (spec.get("linux") or {}).get("namespaces") or ():
        if ns.get("type") == "network" and ns.get("path"):
            return str(ns["path"])
    return None


class CriClient:
    """RuntimeService (plus the one ImageService call the fixture needs) with deadlines."""

    def __init__(
        self,
        address: str,
        *,
        timeout: float = 10.0,
        pod_timeout: float = 60.0,
        cgroup_parent: str = "",
        log_directory: str = "",
    ) -> None:
        self.address = address
        self.timeout = timeout  # for the quick calls
        self.pod_timeout = pod_timeout  # for run/stop/remove, which run CNI and NRI
        self.cgroup_parent = cgroup_parent
        self.log_directory = log_directory
        self.mods = compile_cri()
        self.pb = self.mods.pb2
        self._channel = grpc.insecure_channel(f"unix://{address}")
        self._rt = self.mods.grpc.RuntimeServiceStub(self._channel)
        self._img = self.mods.grpc.ImageServiceStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> CriClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- calls ---------------------------------------------------------------------------------

    def version(self, timeout: float | None = None) -> VersionInfo:
        resp = self._rt.Version(self.pb.VersionRequest(version="v1"), timeout=timeout or self.timeout)
        return VersionInfo(resp.version, resp.runtime_name, resp.runtime_version, resp.runtime_api_version)

    def pod_config(
        self,
        name: str,
        namespace: str,
        uid: str,
        *,
        annotations: Mapping[str, str] | None = None,
        labels: Mapping[str, str] | None = None,
        port_mappings: Iterable[PortMapping | Mapping[str, Any]] | None = None,
        attempt: int = 0,
    ) -> Any:
        pb = self.pb
        ports = []
        for pm in port_mappings or ():
            if not isinstance(pm, PortMapping):
                pm = PortMapping(**pm)
            ports.append(
                pb.PortMapping(
                    protocol=pb.Protocol.Value(pm.protocol.upper()),
                    container_port=pm.container_port,
                    host_port=pm.host_port,
                    host_ip=pm.host_ip,
                )
            )
        return pb.PodSandboxConfig(
            metadata=pb.PodSandboxMetadata(name=name, namespace=namespace, uid=uid, attempt=attempt),
            hostname=name[:63],
            log_directory=self.log_directory,
            port_mappings=ports,
            labels=dict(labels or {}),
            annotations=dict(annotations or {}),
            linux=pb.LinuxPodSandboxConfig(
                cgroup_parent=self.cgroup_parent,
                security_context=pb.LinuxSandboxSecurityContext(
                    namespace_options=pb.NamespaceOption(
                        network=pb.NamespaceMode.POD, pid=pb.NamespaceMode.POD, ipc=pb.NamespaceMode.POD
                    )
                ),
            ),
        )

    def run_pod(
        self,
        name: str,
        namespace: str,
        uid: str,
        annotations: Mapping[str, str] | None = None,
        labels: Mapping[str, str] | None = None,
        port_mappings: Iterable[PortMapping | Mapping[str, Any]] | None = None,
        *,
        timeout: float | None = None,
    ) -> str:
        """RunPodSandbox; returns the pod (sandbox) id."""
        config = self.pod_config(
            name, namespace, uid, annotations=annotations, labels=labels, port_mappings=port_mappings
        )
        resp = self._rt.RunPodSandbox(
            self.pb.RunPodSandboxRequest(config=config), timeout=timeout or self.pod_timeout
        )
        return str(resp.pod_sandbox_id)

    def pod_status(self, pod_id: str, *, verbose: bool = True, timeout: float | None = None) -> PodStatus:
        resp = self._rt.PodSandboxStatus(
            self.pb.PodSandboxStatusRequest(pod_sandbox_id=pod_id, verbose=verbose),
            timeout=timeout or self.timeout,
        )
        st = resp.status
        info = _verbose_info(resp.info)
        return PodStatus(
            id=st.id,
            name=st.metadata.name,
            namespace=st.metadata.namespace,
            uid=st.metadata.uid,
            state=self.pb.PodSandboxState.Name(st.state),
            ip=st.network.ip,
            additional_ips=tuple(p.ip for p in st.network.additional_ips),
            netns_path=_netns_from_info(info),
            info=info,
            annotations=dict(st.annotations),
        )

    def stop_pod(self, pod_id: str, *, timeout: float | None = None) -> None:
        self._rt.StopPodSandbox(
            self.pb.StopPodSandboxRequest(pod_sandbox_id=pod_id), timeout=timeout or self.pod_timeout
        )

    def remove_pod(self, pod_id: str, *, timeout: float | None = None) -> None:
        self._rt.RemovePodSandbox(
            self.pb.RemovePodSandboxRequest(pod_sandbox_id=pod_id), timeout=timeout or self.pod_timeout
        )

    def list_pods(self, *, timeout: float | None = None) -> list[PodInfo]:
        resp = self._rt.ListPodSandbox(self.pb.ListPodSandboxRequest(), timeout=timeout or self.timeout)
        return [
            PodInfo(
                id=p.id,
                name=p.metadata.name,
                namespace=p.metadata.namespace,
                uid=p.metadata.uid,
                state=self.pb.PodSandboxState.Name(p.state),
                labels=dict(p.labels),
                annotations=dict(p.annotations),
            )
            for p in resp.items
        ]

    def image_present(self, ref: str, *, timeout: float | None = None) -> bool:
        resp = self._img.ImageStatus(
            self.pb.ImageStatusRequest(image=self.pb.ImageSpec(image=ref)), timeout=timeout or self.timeout
        )
        return bool(resp.image.id)

    # -- containers ------------------------------------------------------------------------------

    def create_container(
        self,
        pod_id: str,
        sandbox: Any,
        name: str,
        image: str,
        command: Iterable[str],
        *,
        timeout: float | None = None,
    ) -> str:
        """CreateContainer in the pod `pod_id` (`sandbox`: its PodSandboxConfig, pod_config());
        returns the container id."""
        pb = self.pb
        config = pb.ContainerConfig(
            metadata=pb.ContainerMetadata(name=name),
            image=pb.ImageSpec(image=image, user_specified_image=image),
            command=list(command),
            # a PID namespace of its own (CRI-O's test pods have no pod-wide one)
            linux=pb.LinuxContainerConfig(
                security_context=pb.LinuxContainerSecurityContext(
                    namespace_options=pb.NamespaceOption(
                        network=pb.NamespaceMode.POD, pid=pb.NamespaceMode.CONTAINER, ipc=pb.NamespaceMode.POD
                    )
                )
            ),
        )
        resp = self._rt.CreateContainer(
            pb.CreateContainerRequest(pod_sandbox_id=pod_id, config=config, sandbox_config=sandbox),
            timeout=timeout or self.pod_timeout,
        )
        return str(resp.container_id)

    def start_container(self, container_id: str, *, timeout: float | None = None) -> None:
        self._rt.StartContainer(
            self.pb.StartContainerRequest(container_id=container_id), timeout=timeout or self.pod_timeout
        )

    def container_status(
        self, container_id: str, *, timeout: float | None = None
    ) -> tuple[str, dict[str, Any]]:
        """(state name, the verbose info with JSON values decoded)."""
        resp = self._rt.ContainerStatus(
            self.pb.ContainerStatusRequest(container_id=container_id, verbose=True),
            timeout=timeout or self.timeout,
        )
        info = _verbose_info(resp.info)
        return self.pb.ContainerState.Name(resp.status.state), info

    def exec_sync(
        self, container_id: str, cmd: Iterable[str], *, timeout: float | None = None
    ) -> tuple[int, bytes, bytes]:
        """(exit code, stdout, stderr) of `cmd` run in the container."""
        resp = self._rt.ExecSync(
            self.pb.ExecSyncRequest(container_id=container_id, cmd=list(cmd)),
            timeout=timeout or self.pod_timeout,
        )
        return int(resp.exit_code), bytes(resp.stdout), bytes(resp.stderr)

    def list_containers(self, *, timeout: float | None = None) -> list[str]:
        resp = self._rt.ListContainers(self.pb.ListContainersRequest(), timeout=timeout or self.timeout)
        return [c.id for c in resp.containers]

    def stop_container(self, container_id: str, *, timeout: float | None = None) -> None:
        self._rt.StopContainer(
            self.pb.StopContainerRequest(container_id=container_id, timeout=0),
            timeout=timeout or self.pod_timeout,
        )

    def remove_container(self, container_id: str, *, timeout: float | None = None) -> None:
        self._rt.RemoveContainer(
            self.pb.RemoveContainerRequest(container_id=container_id), timeout=timeout or self.pod_timeout
        )


def _verbose_info(info: Any) -> dict[str, Any]:
    """A verbose status's info map: each value JSON where it parses, else the string."""
    out: dict[str, Any] = {}
    for key, value in info.items():
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value
    return out
