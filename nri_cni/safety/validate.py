"""Validation at the edges: every id, name and argument that arrives from outside the node admin's
hands (the runtime's CNI environment, NRI pod events, pod annotations, GC arguments) is checked
here before it reaches a file path, a subprocess or a log line.

The rules:
- container and pod ids follow the CNI spec ("Parameters"): an alphanumeric first character,
  then letters, digits, `_`, `.`, `-`; so an id can never be a path, `.` or `..`;
- interface names follow the kernel (dev_valid_name): 1-15 bytes, not `.`/`..`, no `/`, `:`,
  whitespace or control characters (counted in UTF-8 bytes, as IFNAMSIZ is);
- CNI_ARGS is `KEY=VALUE;KEY=VALUE`, each item split on its first `=` only; a value holding `=` or
  `;` cannot be passed on to a plugin (libcni's parser refuses it), so it is refused here, before
  anything (an intent record) is written.

A refused input is an `InvalidInput`: CNI error 4 ("invalid environment variables"), gRPC
INVALID_ARGUMENT, with the offending value escaped and cut (`quote`).
"""

from __future__ import annotations

import re
import unicodedata

from nri_cni.errors import Kind, NriCniError

MAX_ID_BYTES = 128  # containerd and CRI-O ids are 64 hex digits; a file name holds 255 bytes
MAX_IFNAME_BYTES = 15  # IFNAMSIZ - 1
MAX_ARG_VALUE_BYTES = 253  # a Kubernetes object name (DNS subdomain) at most
MAX_QUOTED = 200  # characters of untrusted text quoted in an error or a log line

_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*", re.ASCII)
_ARG_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*", re.ASCII)
# Kubernetes names, namespaces and UIDs: DNS labels/subdomains and UUIDs fit in this.
_K8S_VALUE = re.compile(r"[A-Za-z0-9_.\-]*", re.ASCII)
_K8S_KEYS = ("K8S_POD_NAME", "K8S_POD_NAMESPACE", "K8S_POD_UID")


class InvalidInput(NriCniError):
    """An input from outside the node admin's hands broke a rule; nothing was touched."""

    kind = Kind.BAD_ENV  # CNI error 4, INVALID_ARGUMENT (errors.WIRE)


def quote(value: object, limit: int = MAX_QUOTED) -> str:
    """`value` as a printable, escaped literal for an error or a log, cut to `limit` characters
    of input (escaping can at most quadruple that) with the number of characters left out."""
    text = value if isinstance(value, str) else repr(value)
    cut = text[:limit]
    out = repr(cut)
    if len(text) > limit:
        out += f"...(+{len(text) - limit} characters)"
    return out


def quote_whole(value: str) -> str:
    """An invalid id as it came, escaped but not cut: a path trick must show in the log whole."""
    return repr(value)


def is_valid_id(value: object) -> bool:
    return isinstance(value, str) and 0 < len(value) <= MAX_ID_BYTES and _ID.fullmatch(value) is not None


def check_id(value: object, what: str = "CNI_CONTAINERID") -> str:
    """A container or pod sandbox id, per the CNI spec; raises InvalidInput naming it."""
    if is_valid_id(value):
        return value  # type: ignore[return-value]
    if not value:
        raise InvalidInput(f"{what} is empty")
    raise InvalidInput(
        f"{what} {quote(value)} is not a valid id (an alphanumeric first character, then letters, "
        f"digits, '_', '.', '-'; at most {MAX_ID_BYTES} characters)"
    )


def ifname_problem(name: object) -> str:
    """Why `name` is not a valid kernel interface name; "" when it is one."""
    if not isinstance(name, str):
        return "must be a string"
    if not name:
        return "is empty"
    size = len(name.encode("utf-8", "surrogatepass"))
    if size > MAX_IFNAME_BYTES:
        return f"is {size} bytes long (at most {MAX_IFNAME_BYTES})"
    if name in (".", ".."):
        return "is not allowed"
    for ch in name:
        if ch in "/:" or ch.isspace() or unicodedata.category(ch)[0] == "C":
            return "has '/', ':', whitespace or a control character"
    return ""


def check_ifname(name: object, what: str = "CNI_IFNAME") -> str:
    problem = ifname_problem(name)
    if problem:
        raise InvalidInput(f"{what}: interface name {quote(name)} {problem}")
    return name  # type: ignore[return-value]


def cni_args_pairs(text: str) -> list[tuple[str, str]]:
    """CNI_ARGS as the runtime sets it, `KEY=VALUE;...`, as pairs in their order (the one parser:
    the shim's CNI calls and `nri-cni cni` read it here). Empty items are skipped; a key must be
    an identifier; a value may not hold `=`, `;` or control characters; the Kubernetes keys must
    look like Kubernetes names. Raises InvalidInput."""
    out: list[tuple[str, str]] = []
    for item in text.split(";"):
        if not item:
            continue
        key, sep, value = item.partition("=")
        if not sep or not _ARG_KEY.fullmatch(key):
            raise InvalidInput(f"CNI_ARGS item {quote(item)} is not KEY=VALUE")
        if "=" in value or len(value.encode("utf-8", "surrogatepass")) > MAX_ARG_VALUE_BYTES:
            raise InvalidInput(f"CNI_ARGS {key}: value {quote(value)} holds '=' or is too long")
        if any(unicodedata.category(ch)[0] == "C" for ch in value):
            raise InvalidInput(f"CNI_ARGS {key}: value {quote(value)} holds control characters")
        if key in _K8S_KEYS:
            check_k8s_value(value, f"CNI_ARGS {key}")
        if key == "K8S_POD_INFRA_CONTAINER_ID" and value:
            check_id(value, "CNI_ARGS K8S_POD_INFRA_CONTAINER_ID")
        out.append((key, value))
    return out


def check_k8s_value(value: object, what: str) -> str:
    """A pod name, namespace or uid as it goes into CNI_ARGS (empty allowed: not known)."""
    if not isinstance(value, str) or len(value) > MAX_ARG_VALUE_BYTES or _K8S_VALUE.fullmatch(value) is None:
        raise InvalidInput(f"{what} {quote(value)} is not a Kubernetes name (letters, digits, '_', '.', '-')")
    return value


def check_pod(pod_id: object, name: object, namespace: object, uid: object, what: str) -> None:
    """A pod as an NRI event or the shim describes it: its id and what goes into CNI_ARGS."""
    check_id(pod_id, f"{what} pod id")
    check_k8s_value(name, f"{what} pod name")
    check_k8s_value(namespace, f"{what} pod namespace")
    check_k8s_value(uid, f"{what} pod uid")


def check_selection(networks: list[str], *, max_networks: int, max_per_network: int, where: str) -> None:
    """The networks a pod is about to get, by name in attachment order: at most `max_networks`
    of them and at most `max_per_network` attachments of one network."""
    if len(networks) > max_networks:
        raise InvalidInput(
            f"{where}: {len(networks)} networks for one pod, more than the limit of {max_networks} "
            "(limits.networks_per_pod)"
        )
    counts: dict[str, int] = {}
    for name in networks:
        counts[name] = counts.get(name, 0) + 1
        if counts[name] > max_per_network:
            raise InvalidInput(
                f"{where}: network {name!r} attached {counts[name]} times to one pod, more than the "
                f"limit of {max_per_network} (limits.attachments_per_network)"
            )


VALID_ATTACHMENTS_KEYS = ("cni.dev/valid-attachments", "cni.dev/attachments")


def gc_valid_ids(conf: dict) -> set[str]:
    """The container ids of a CNI GC's `cni.dev/valid-attachments`: a list of objects with a
    string `containerID` and `ifname`. Anything else refuses the whole GC (InvalidInput):
    reading a malformed list as "nothing is valid" would delete every live pod's networks."""
    key = next((k for k in VALID_ATTACHMENTS_KEYS if k in conf), None)
    if key is None or conf[key] is None:
        return set()
    value = conf[key]
    if not isinstance(value, list):
        raise InvalidInput(f"GC: {key} must be a list of {{containerID, ifname}}, not {type(value).__name__}")
    out: set[str] = set()
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise InvalidInput(f"GC: {key}[{i}] must be an object {{containerID, ifname}}")
        cid, ifname = item.get("containerID"), item.get("ifname")
        if not isinstance(cid, str) or not isinstance(ifname, str):
            raise InvalidInput(f"GC: {key}[{i}] needs string containerID and ifname")
        out.add(check_id(cid, f"GC: {key}[{i}].containerID"))
        check_ifname(ifname, f"GC: {key}[{i}].ifname")
    return out


MAX_ERROR_TEXT = 1024


def cap_text(text: str, limit: int = MAX_ERROR_TEXT) -> str:
    """An error message or details bound for a CNI error object or a log: at most `limit`
    characters (the values quoted inside it are cut already; this bounds their number)."""
    if len(text) <= limit:
        return text
    return text[:limit] + f"...(+{len(text) - limit} characters)"


_VERSION = re.compile(r"[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}", re.ASCII)


def cni_version(value: object, default: str) -> str:
    """The cniVersion to answer a shim call with: the caller's when it looks like a version."""
    return value if isinstance(value, str) and _VERSION.fullmatch(value) else default


def shown(text: str, limit: int = MAX_QUOTED) -> str:
    """Printable text as it is; anything else (control characters, too long) quoted and cut."""
    return text if text.isprintable() and len(text) <= limit else quote(text, limit)
