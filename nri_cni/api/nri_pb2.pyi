from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Event(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    UNKNOWN: _ClassVar[Event]
    RUN_POD_SANDBOX: _ClassVar[Event]
    STOP_POD_SANDBOX: _ClassVar[Event]
    REMOVE_POD_SANDBOX: _ClassVar[Event]
    CREATE_CONTAINER: _ClassVar[Event]
    POST_CREATE_CONTAINER: _ClassVar[Event]
    START_CONTAINER: _ClassVar[Event]
    POST_START_CONTAINER: _ClassVar[Event]
    UPDATE_CONTAINER: _ClassVar[Event]
    POST_UPDATE_CONTAINER: _ClassVar[Event]
    STOP_CONTAINER: _ClassVar[Event]
    REMOVE_CONTAINER: _ClassVar[Event]
    UPDATE_POD_SANDBOX: _ClassVar[Event]
    POST_UPDATE_POD_SANDBOX: _ClassVar[Event]
    VALIDATE_CONTAINER_ADJUSTMENT: _ClassVar[Event]
    LAST: _ClassVar[Event]

class ContainerState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CONTAINER_UNKNOWN: _ClassVar[ContainerState]
    CONTAINER_CREATED: _ClassVar[ContainerState]
    CONTAINER_PAUSED: _ClassVar[ContainerState]
    CONTAINER_RUNNING: _ClassVar[ContainerState]
    CONTAINER_STOPPED: _ClassVar[ContainerState]
UNKNOWN: Event
RUN_POD_SANDBOX: Event
STOP_POD_SANDBOX: Event
REMOVE_POD_SANDBOX: Event
CREATE_CONTAINER: Event
POST_CREATE_CONTAINER: Event
START_CONTAINER: Event
POST_START_CONTAINER: Event
UPDATE_CONTAINER: Event
POST_UPDATE_CONTAINER: Event
STOP_CONTAINER: Event
REMOVE_CONTAINER: Event
UPDATE_POD_SANDBOX: Event
POST_UPDATE_POD_SANDBOX: Event
VALIDATE_CONTAINER_ADJUSTMENT: Event
LAST: Event
CONTAINER_UNKNOWN: ContainerState
CONTAINER_CREATED: ContainerState
CONTAINER_PAUSED: ContainerState
CONTAINER_RUNNING: ContainerState
CONTAINER_STOPPED: ContainerState

class Empty(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RegisterPluginRequest(_message.Message):
    __slots__ = ("plugin_name", "plugin_idx", "NRI_version")
    PLUGIN_NAME_FIELD_NUMBER: _ClassVar[int]
    PLUGIN_IDX_FIELD_NUMBER: _ClassVar[int]
    NRI_VERSION_FIELD_NUMBER: _ClassVar[int]
    plugin_name: str
    plugin_idx: str
    NRI_version: str
    def __init__(self, plugin_name: _Optional[str] = ..., plugin_idx: _Optional[str] = ..., NRI_version: _Optional[str] = ...) -> None: ...

class UpdateContainersRequest(_message.Message):
    __slots__ = ("update", "evict")
    UPDATE_FIELD_NUMBER: _ClassVar[int]
    EVICT_FIELD_NUMBER: _ClassVar[int]
    update: _containers.RepeatedCompositeFieldContainer[ContainerUpdate]
    evict: _containers.RepeatedCompositeFieldContainer[ContainerEviction]
    def __init__(self, update: _Optional[_Iterable[_Union[ContainerUpdate, _Mapping]]] = ..., evict: _Optional[_Iterable[_Union[ContainerEviction, _Mapping]]] = ...) -> None: ...

class UpdateContainersResponse(_message.Message):
    __slots__ = ("failed",)
    FAILED_FIELD_NUMBER: _ClassVar[int]
    failed: _containers.RepeatedCompositeFieldContainer[ContainerUpdate]
    def __init__(self, failed: _Optional[_Iterable[_Union[ContainerUpdate, _Mapping]]] = ...) -> None: ...

class ConfigureRequest(_message.Message):
    __slots__ = ("config", "runtime_name", "runtime_version", "registration_timeout", "request_timeout", "NRI_version")
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_NAME_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_VERSION_FIELD_NUMBER: _ClassVar[int]
    REGISTRATION_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    REQUEST_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    NRI_VERSION_FIELD_NUMBER: _ClassVar[int]
    config: str
    runtime_name: str
    runtime_version: str
    registration_timeout: int
    request_timeout: int
    NRI_version: str
    def __init__(self, config: _Optional[str] = ..., runtime_name: _Optional[str] = ..., runtime_version: _Optional[str] = ..., registration_timeout: _Optional[int] = ..., request_timeout: _Optional[int] = ..., NRI_version: _Optional[str] = ...) -> None: ...

class ConfigureResponse(_message.Message):
    __slots__ = ("events", "request_timeout")
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    events: int
    request_timeout: int
    def __init__(self, events: _Optional[int] = ..., request_timeout: _Optional[int] = ...) -> None: ...

class SynchronizeRequest(_message.Message):
    __slots__ = ("pods", "containers", "more")
    PODS_FIELD_NUMBER: _ClassVar[int]
    CONTAINERS_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    pods: _containers.RepeatedCompositeFieldContainer[PodSandbox]
    containers: _containers.RepeatedCompositeFieldContainer[Container]
    more: bool
    def __init__(self, pods: _Optional[_Iterable[_Union[PodSandbox, _Mapping]]] = ..., containers: _Optional[_Iterable[_Union[Container, _Mapping]]] = ..., more: _Optional[bool] = ...) -> None: ...

class SynchronizeResponse(_message.Message):
    __slots__ = ("update", "more")
    UPDATE_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    update: _containers.RepeatedCompositeFieldContainer[ContainerUpdate]
    more: bool
    def __init__(self, update: _Optional[_Iterable[_Union[ContainerUpdate, _Mapping]]] = ..., more: _Optional[bool] = ...) -> None: ...

class RunPodSandboxRequest(_message.Message):
    __slots__ = ("pod",)
    POD_FIELD_NUMBER: _ClassVar[int]
    pod: PodSandbox
    def __init__(self, pod: _Optional[_Union[PodSandbox, _Mapping]] = ...) -> None: ...

class RunPodSandboxResponse(_message.Message):
    __slots__ = ("adjust",)
    ADJUST_FIELD_NUMBER: _ClassVar[int]
    adjust: PodSandboxAdjustment
    def __init__(self, adjust: _Optional[_Union[PodSandboxAdjustment, _Mapping]] = ...) -> None: ...

class PodSandboxAdjustment(_message.Message):
    __slots__ = ("network",)
    NETWORK_FIELD_NUMBER: _ClassVar[int]
    network: PodSandboxNetwork
    def __init__(self, network: _Optional[_Union[PodSandboxNetwork, _Mapping]] = ...) -> None: ...

class PodSandboxNetwork(_message.Message):
    __slots__ = ("ips", "interfaces", "routes", "dns")
    IPS_FIELD_NUMBER: _ClassVar[int]
    INTERFACES_FIELD_NUMBER: _ClassVar[int]
    ROUTES_FIELD_NUMBER: _ClassVar[int]
    DNS_FIELD_NUMBER: _ClassVar[int]
    ips: _containers.RepeatedScalarFieldContainer[str]
    interfaces: _containers.RepeatedCompositeFieldContainer[NetworkInterface]
    routes: _containers.RepeatedCompositeFieldContainer[NetworkRoute]
    dns: NetworkDNS
    def __init__(self, ips: _Optional[_Iterable[str]] = ..., interfaces: _Optional[_Iterable[_Union[NetworkInterface, _Mapping]]] = ..., routes: _Optional[_Iterable[_Union[NetworkRoute, _Mapping]]] = ..., dns: _Optional[_Union[NetworkDNS, _Mapping]] = ...) -> None: ...

class NetworkInterface(_message.Message):
    __slots__ = ("network", "name", "mac", "mtu", "sandbox", "pci_id", "socket_path", "ips", "metadata")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NETWORK_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    MAC_FIELD_NUMBER: _ClassVar[int]
    MTU_FIELD_NUMBER: _ClassVar[int]
    SANDBOX_FIELD_NUMBER: _ClassVar[int]
    PCI_ID_FIELD_NUMBER: _ClassVar[int]
    SOCKET_PATH_FIELD_NUMBER: _ClassVar[int]
    IPS_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    network: str
    name: str
    mac: str
    mtu: int
    sandbox: str
    pci_id: str
    socket_path: str
    ips: _containers.RepeatedCompositeFieldContainer[IPConfig]
    metadata: _containers.ScalarMap[str, str]
    def __init__(self, network: _Optional[str] = ..., name: _Optional[str] = ..., mac: _Optional[str] = ..., mtu: _Optional[int] = ..., sandbox: _Optional[str] = ..., pci_id: _Optional[str] = ..., socket_path: _Optional[str] = ..., ips: _Optional[_Iterable[_Union[IPConfig, _Mapping]]] = ..., metadata: _Optional[_Mapping[str, str]] = ...) -> None: ...

class IPConfig(_message.Message):
    __slots__ = ("address", "gateway")
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    GATEWAY_FIELD_NUMBER: _ClassVar[int]
    address: str
    gateway: str
    def __init__(self, address: _Optional[str] = ..., gateway: _Optional[str] = ...) -> None: ...

class NetworkRoute(_message.Message):
    __slots__ = ("network", "dst", "gw", "mtu", "table", "scope", "interface")
    NETWORK_FIELD_NUMBER: _ClassVar[int]
    DST_FIELD_NUMBER: _ClassVar[int]
    GW_FIELD_NUMBER: _ClassVar[int]
    MTU_FIELD_NUMBER: _ClassVar[int]
    TABLE_FIELD_NUMBER: _ClassVar[int]
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    INTERFACE_FIELD_NUMBER: _ClassVar[int]
    network: str
    dst: str
    gw: str
    mtu: int
    table: int
    scope: int
    interface: str
    def __init__(self, network: _Optional[str] = ..., dst: _Optional[str] = ..., gw: _Optional[str] = ..., mtu: _Optional[int] = ..., table: _Optional[int] = ..., scope: _Optional[int] = ..., interface: _Optional[str] = ...) -> None: ...

class NetworkDNS(_message.Message):
    __slots__ = ("nameservers", "domain", "search", "options")
    NAMESERVERS_FIELD_NUMBER: _ClassVar[int]
    DOMAIN_FIELD_NUMBER: _ClassVar[int]
    SEARCH_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    nameservers: _containers.RepeatedScalarFieldContainer[str]
    domain: str
    search: _containers.RepeatedScalarFieldContainer[str]
    options: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, nameservers: _Optional[_Iterable[str]] = ..., domain: _Optional[str] = ..., search: _Optional[_Iterable[str]] = ..., options: _Optional[_Iterable[str]] = ...) -> None: ...

class UpdatePodSandboxRequest(_message.Message):
    __slots__ = ("pod",)
    POD_FIELD_NUMBER: _ClassVar[int]
    pod: PodSandbox
    def __init__(self, pod: _Optional[_Union[PodSandbox, _Mapping]] = ...) -> None: ...

class UpdatePodSandboxResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PostUpdatePodSandboxRequest(_message.Message):
    __slots__ = ("pod",)
    POD_FIELD_NUMBER: _ClassVar[int]
    pod: PodSandbox
    def __init__(self, pod: _Optional[_Union[PodSandbox, _Mapping]] = ...) -> None: ...

class PostUpdatePodSandboxResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StopPodSandboxRequest(_message.Message):
    __slots__ = ("pod",)
    POD_FIELD_NUMBER: _ClassVar[int]
    pod: PodSandbox
    def __init__(self, pod: _Optional[_Union[PodSandbox, _Mapping]] = ...) -> None: ...

class StopPodSandboxResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RemovePodSandboxRequest(_message.Message):
    __slots__ = ("pod",)
    POD_FIELD_NUMBER: _ClassVar[int]
    pod: PodSandbox
    def __init__(self, pod: _Optional[_Union[PodSandbox, _Mapping]] = ...) -> None: ...

class RemovePodSandboxResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CreateContainerRequest(_message.Message):
    __slots__ = ("pod", "container")
    POD_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_FIELD_NUMBER: _ClassVar[int]
    pod: PodSandbox
    container: Container
    def __init__(self, pod: _Optional[_Union[PodSandbox, _Mapping]] = ..., container: _Optional[_Union[Container, _Mapping]] = ...) -> None: ...

class CreateContainerResponse(_message.Message):
    __slots__ = ("adjust", "update", "evict")
    ADJUST_FIELD_NUMBER: _ClassVar[int]
    UPDATE_FIELD_NUMBER: _ClassVar[int]
    EVICT_FIELD_NUMBER: _ClassVar[int]
    adjust: ContainerAdjustment
    update: _containers.RepeatedCompositeFieldContainer[ContainerUpdate]
    evict: _containers.RepeatedCompositeFieldContainer[ContainerEviction]
    def __init__(self, adjust: _Optional[_Union[ContainerAdjustment, _Mapping]] = ..., update: _Optional[_Iterable[_Union[ContainerUpdate, _Mapping]]] = ..., evict: _Optional[_Iterable[_Union[ContainerEviction, _Mapping]]] = ...) -> None: ...

class ContainerAdjustment(_message.Message):
    __slots__ = ("annotations", "mounts", "env")
    class AnnotationsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ANNOTATIONS_FIELD_NUMBER: _ClassVar[int]
    MOUNTS_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    annotations: _containers.ScalarMap[str, str]
    mounts: _containers.RepeatedCompositeFieldContainer[Mount]
    env: _containers.RepeatedCompositeFieldContainer[KeyValue]
    def __init__(self, annotations: _Optional[_Mapping[str, str]] = ..., mounts: _Optional[_Iterable[_Union[Mount, _Mapping]]] = ..., env: _Optional[_Iterable[_Union[KeyValue, _Mapping]]] = ...) -> None: ...

class Mount(_message.Message):
    __slots__ = ("destination", "type", "source", "options")
    DESTINATION_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    destination: str
    type: str
    source: str
    options: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, destination: _Optional[str] = ..., type: _Optional[str] = ..., source: _Optional[str] = ..., options: _Optional[_Iterable[str]] = ...) -> None: ...

class KeyValue(_message.Message):
    __slots__ = ("key", "value")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    key: str
    value: str
    def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...

class PostCreateContainerRequest(_message.Message):
    __slots__ = ("pod", "container")
    POD_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_FIELD_NUMBER: _ClassVar[int]
    pod: PodSandbox
    container: Container
    def __init__(self, pod: _Optional[_Union[PodSandbox, _Mapping]] = ..., container: _Optional[_Union[Container, _Mapping]] = ...) -> None: ...

class PostCreateContainerResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StartContainerRequest(_message.Message):
    __slots__ = ("pod", "container")
    POD_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_FIELD_NUMBER: _ClassVar[int]
    pod: PodSandbox
    container: Container
    def __init__(self, pod: _Optional[_Union[PodSandbox, _Mapping]] = ..., container: _Optional[_Union[Container, _Mapping]] = ...) -> None: ...

class StartContainerResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PostStartContainerRequest(_message.Message):
    __slots__ = ("pod", "container")
    POD_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_FIELD_NUMBER: _ClassVar[int]
    pod: PodSandbox
    container: Container
    def __init__(self, pod: _Optional[_Union[PodSandbox, _Mapping]] = ..., container: _Optional[_Union[Container, _Mapping]] = ...) -> None: ...

class PostStartContainerResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class UpdateContainerRequest(_message.Message):
    __slots__ = ("pod", "container")
    POD_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_FIELD_NUMBER: _ClassVar[int]
    pod: PodSandbox
    container: Container
    def __init__(self, pod: _Optional[_Union[PodSandbox, _Mapping]] = ..., container: _Optional[_Union[Container, _Mapping]] = ...) -> None: ...

class UpdateContainerResponse(_message.Message):
    __slots__ = ("update", "evict")
    UPDATE_FIELD_NUMBER: _ClassVar[int]
    EVICT_FIELD_NUMBER: _ClassVar[int]
    update: _containers.RepeatedCompositeFieldContainer[ContainerUpdate]
    evict: _containers.RepeatedCompositeFieldContainer[ContainerEviction]
    def __init__(self, update: _Optional[_Iterable[_Union[ContainerUpdate, _Mapping]]] = ..., evict: _Optional[_Iterable[_Union[ContainerEviction, _Mapping]]] = ...) -> None: ...

class PostUpdateContainerRequest(_message.Message):
    __slots__ = ("pod", "container")
    POD_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_FIELD_NUMBER: _ClassVar[int]
    pod: PodSandbox
    container: Container
    def __init__(self, pod: _Optional[_Union[PodSandbox, _Mapping]] = ..., container: _Optional[_Union[Container, _Mapping]] = ...) -> None: ...

class PostUpdateContainerResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StopContainerRequest(_message.Message):
    __slots__ = ("pod", "container")
    POD_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_FIELD_NUMBER: _ClassVar[int]
    pod: PodSandbox
    container: Container
    def __init__(self, pod: _Optional[_Union[PodSandbox, _Mapping]] = ..., container: _Optional[_Union[Container, _Mapping]] = ...) -> None: ...

class StopContainerResponse(_message.Message):
    __slots__ = ("update",)
    UPDATE_FIELD_NUMBER: _ClassVar[int]
    update: _containers.RepeatedCompositeFieldContainer[ContainerUpdate]
    def __init__(self, update: _Optional[_Iterable[_Union[ContainerUpdate, _Mapping]]] = ...) -> None: ...

class RemoveContainerRequest(_message.Message):
    __slots__ = ("pod", "container")
    POD_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_FIELD_NUMBER: _ClassVar[int]
    pod: PodSandbox
    container: Container
    def __init__(self, pod: _Optional[_Union[PodSandbox, _Mapping]] = ..., container: _Optional[_Union[Container, _Mapping]] = ...) -> None: ...

class RemoveContainerResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StateChangeEvent(_message.Message):
    __slots__ = ("event", "pod", "container")
    EVENT_FIELD_NUMBER: _ClassVar[int]
    POD_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_FIELD_NUMBER: _ClassVar[int]
    event: Event
    pod: PodSandbox
    container: Container
    def __init__(self, event: _Optional[_Union[Event, str]] = ..., pod: _Optional[_Union[PodSandbox, _Mapping]] = ..., container: _Optional[_Union[Container, _Mapping]] = ...) -> None: ...

class ValidateContainerAdjustmentRequest(_message.Message):
    __slots__ = ("pod", "container", "update", "plugins")
    POD_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_FIELD_NUMBER: _ClassVar[int]
    UPDATE_FIELD_NUMBER: _ClassVar[int]
    PLUGINS_FIELD_NUMBER: _ClassVar[int]
    pod: PodSandbox
    container: Container
    update: _containers.RepeatedCompositeFieldContainer[ContainerUpdate]
    plugins: _containers.RepeatedCompositeFieldContainer[PluginInstance]
    def __init__(self, pod: _Optional[_Union[PodSandbox, _Mapping]] = ..., container: _Optional[_Union[Container, _Mapping]] = ..., update: _Optional[_Iterable[_Union[ContainerUpdate, _Mapping]]] = ..., plugins: _Optional[_Iterable[_Union[PluginInstance, _Mapping]]] = ...) -> None: ...

class PluginInstance(_message.Message):
    __slots__ = ("name", "index")
    NAME_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    name: str
    index: str
    def __init__(self, name: _Optional[str] = ..., index: _Optional[str] = ...) -> None: ...

class ValidateContainerAdjustmentResponse(_message.Message):
    __slots__ = ("reject", "reason")
    REJECT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    reject: bool
    reason: str
    def __init__(self, reject: _Optional[bool] = ..., reason: _Optional[str] = ...) -> None: ...

class PodSandbox(_message.Message):
    __slots__ = ("id", "name", "uid", "namespace", "labels", "annotations", "runtime_handler", "linux", "pid", "ips")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class AnnotationsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    ANNOTATIONS_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_HANDLER_FIELD_NUMBER: _ClassVar[int]
    LINUX_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    IPS_FIELD_NUMBER: _ClassVar[int]
    id: str
    name: str
    uid: str
    namespace: str
    labels: _containers.ScalarMap[str, str]
    annotations: _containers.ScalarMap[str, str]
    runtime_handler: str
    linux: LinuxPodSandbox
    pid: int
    ips: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, id: _Optional[str] = ..., name: _Optional[str] = ..., uid: _Optional[str] = ..., namespace: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., annotations: _Optional[_Mapping[str, str]] = ..., runtime_handler: _Optional[str] = ..., linux: _Optional[_Union[LinuxPodSandbox, _Mapping]] = ..., pid: _Optional[int] = ..., ips: _Optional[_Iterable[str]] = ...) -> None: ...

class LinuxPodSandbox(_message.Message):
    __slots__ = ("cgroup_parent", "cgroups_path", "namespaces")
    CGROUP_PARENT_FIELD_NUMBER: _ClassVar[int]
    CGROUPS_PATH_FIELD_NUMBER: _ClassVar[int]
    NAMESPACES_FIELD_NUMBER: _ClassVar[int]
    cgroup_parent: str
    cgroups_path: str
    namespaces: _containers.RepeatedCompositeFieldContainer[LinuxNamespace]
    def __init__(self, cgroup_parent: _Optional[str] = ..., cgroups_path: _Optional[str] = ..., namespaces: _Optional[_Iterable[_Union[LinuxNamespace, _Mapping]]] = ...) -> None: ...

class LinuxNamespace(_message.Message):
    __slots__ = ("type", "path")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    type: str
    path: str
    def __init__(self, type: _Optional[str] = ..., path: _Optional[str] = ...) -> None: ...

class Container(_message.Message):
    __slots__ = ("id", "pod_sandbox_id", "name", "state", "labels", "annotations", "args", "env", "pid", "created_at", "started_at", "finished_at", "exit_code", "status_reason", "status_message")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class AnnotationsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    POD_SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    ANNOTATIONS_FIELD_NUMBER: _ClassVar[int]
    ARGS_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    STATUS_REASON_FIELD_NUMBER: _ClassVar[int]
    STATUS_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    id: str
    pod_sandbox_id: str
    name: str
    state: ContainerState
    labels: _containers.ScalarMap[str, str]
    annotations: _containers.ScalarMap[str, str]
    args: _containers.RepeatedScalarFieldContainer[str]
    env: _containers.RepeatedScalarFieldContainer[str]
    pid: int
    created_at: int
    started_at: int
    finished_at: int
    exit_code: int
    status_reason: str
    status_message: str
    def __init__(self, id: _Optional[str] = ..., pod_sandbox_id: _Optional[str] = ..., name: _Optional[str] = ..., state: _Optional[_Union[ContainerState, str]] = ..., labels: _Optional[_Mapping[str, str]] = ..., annotations: _Optional[_Mapping[str, str]] = ..., args: _Optional[_Iterable[str]] = ..., env: _Optional[_Iterable[str]] = ..., pid: _Optional[int] = ..., created_at: _Optional[int] = ..., started_at: _Optional[int] = ..., finished_at: _Optional[int] = ..., exit_code: _Optional[int] = ..., status_reason: _Optional[str] = ..., status_message: _Optional[str] = ...) -> None: ...

class ContainerUpdate(_message.Message):
    __slots__ = ("container_id", "ignore_failure")
    CONTAINER_ID_FIELD_NUMBER: _ClassVar[int]
    IGNORE_FAILURE_FIELD_NUMBER: _ClassVar[int]
    container_id: str
    ignore_failure: bool
    def __init__(self, container_id: _Optional[str] = ..., ignore_failure: _Optional[bool] = ...) -> None: ...

class ContainerEviction(_message.Message):
    __slots__ = ("container_id", "reason")
    CONTAINER_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    container_id: str
    reason: str
    def __init__(self, container_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...
