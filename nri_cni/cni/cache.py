"""libcni's attachment cache (<cache_dir>/results/<net>-<cid>-<ifname>), byte-compatible.

Files are written the way Go's encoding/json writes libcni's cachedInfo struct (field order,
compact, nested maps with sorted keys, <>& escaped, config as base64), so containerd, CRI-O,
cnitool and nri-cni can read each other's entries. Unlike libcni the write is atomic (temp
file, rename): a reader never sees half an entry. It is durable too (fsync of the file and
the directory), either before write() returns or, for the ADD path, right after via sync().
Keys are read case-insensitively, as Go does (ocicni writes "containerID"). The daemon's
deletes go through <cache_dir>/results-deleted/ (`remove_soon`, files.remove_soon).
"""

from __future__ import annotations

import base64
import binascii
import decimal
import functools
import json
import logging
import os
import queue
import threading
from dataclasses import dataclass, field
from typing import Any

from nri_cni.errors import CniCode, CNIError, ConfigError
from nri_cni.safety import files, jsonlimits
from nri_cni.safety.files import AtomicFile, fsync_dir

log = logging.getLogger(__name__)

KIND = "cniCacheV1"
DEFAULT_CACHE_DIR = "/var/lib/cni"

# Go's json.Marshal escapes these even inside strings (HTML safety); match it byte for byte.
_GO_ESCAPES = str.maketrans(
    {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}
)


# one encoder: json.dumps() with options builds a new one per call
_GO_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, sort_keys=True)


def _go_json(value: Any) -> str:
    return _GO_ENCODER.encode(value).translate(_GO_ESCAPES)


@functools.lru_cache(maxsize=64)
def _b64(config: bytes) -> str:
    """A network's config, as its entries hold it (one bytes object per generation: hashed once)."""
    return base64.b64encode(config).decode()


def _result_tail(result: dict[str, Any] | None) -> str:
    return f',"result":{_go_json(_as_float64(result))}}}' if result else "}"


_EXACT = 1 << 53  # float64 holds every integer below this


def _as_float64(value: Any) -> Any:
    """A result's numbers as libcni writes them: it decodes the result into a Go map, so every
    number passes through a float64 (9007199254740993 is written 9007199254740992), which Go
    writes with the fewest digits that read back as it (2**60 + 1 is written 1152921504606847000):
    repr's digits, positional below 1e21, in the exponent form from there."""
    if isinstance(value, dict):
        return {k: _as_float64(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_as_float64(v) for v in value]
    if isinstance(value, int) and not -_EXACT < value < _EXACT:  # a bool, 0 or 1, is left as it is
        rounded = float(value)
        return int(decimal.Decimal(repr(rounded))) if abs(rounded) < 1e21 else rounded
    return value


def _io_failure(doing: str, path: str, exc: OSError) -> CNIError:
    """CNIError(IO_FAILURE) for an OSError while the entry at `path` was written or synced."""
    details = exc.strerror or str(exc)
    return CNIError(CniCode.IO_FAILURE, f"cannot {doing} CNI cache file {path}", details=details)


class CorruptEntry(ValueError):
    """A cache file that is empty, not JSON, or not a cniCacheV1 object."""


@dataclass
class CacheEntry:
    container_id: str
    ifname: str
    network_name: str
    config: bytes  # the conflist bytes the attachment was made with
    netns: str = ""
    cni_args: list[tuple[str, str]] = field(default_factory=list)
    capability_args: dict[str, Any] = field(default_factory=dict[str, Any])
    result: dict[str, Any] | None = None  # the final ADD result, in the version it was printed in
    path: str = ""  # where it was read from (not serialised)

    @property
    def key(self) -> tuple[str, str]:  # the attachment it records: (network, ifname)
        return (self.network_name, self.ifname)

    def to_json(self) -> bytes:
        """libcni's cachedInfo as Go marshals it."""
        return (self._head() + _result_tail(self.result)).encode()

    def _head(self) -> str:
        """Every field but the last, the result (PreparedWrite appends that once known)."""
        parts = [
            f'"kind":{_go_json(KIND)}',
            f'"containerId":{_go_json(self.container_id)}',
            f'"config":"{_b64(self.config)}"',
            f'"ifName":{_go_json(self.ifname)}',
            f'"networkName":{_go_json(self.network_name)}',
        ]
        if self.netns:
            parts.append(f'"netns":{_go_json(self.netns)}')
        if self.cni_args:
            parts.append(f'"cniArgs":{_go_json([list(kv) for kv in self.cni_args])}')
        if self.capability_args:
            parts.append(f'"capabilityArgs":{_go_json(self.capability_args)}')
        return "{" + ",".join(parts)

    @classmethod
    def from_json(cls, data: bytes, path: str = "") -> CacheEntry:
        """Parses an entry; raises CorruptEntry."""
        if not data.strip():
            raise CorruptEntry("empty file")
        try:
            obj = jsonlimits.loads(data)
        except (ValueError, UnicodeDecodeError) as exc:
            raise CorruptEntry(f"not JSON: {exc}") from None
        if not isinstance(obj, dict):
            raise CorruptEntry("not a JSON object")
        folded = {k.lower(): v for k, v in obj.items()}  # later duplicates win, as in Go
        if folded.get("kind") != KIND:
            raise CorruptEntry(f"kind is {folded.get('kind')!r}, not {KIND!r}")
        strs = {}
        for key in ("containerid", "ifname", "networkname", "netns", "config"):
            val = folded.get(key)
            if val is not None and not isinstance(val, str):
                raise CorruptEntry(f"{key} is not a string")
            strs[key] = val or ""
        try:
            config = base64.b64decode(strs["config"], validate=True)
        except binascii.Error:
            raise CorruptEntry("config is not base64") from None
        args = folded.get("cniargs") or []
        if not isinstance(args, list) or not all(
            isinstance(kv, list) and len(kv) == 2 and all(isinstance(s, str) for s in kv) for kv in args
        ):
            raise CorruptEntry("cniArgs is not a list of [key, value] pairs")
        caps = folded.get("capabilityargs") or {}
        result = folded.get("result")
        if not isinstance(caps, dict) or (result is not None and not isinstance(result, dict)):
            raise CorruptEntry("capabilityArgs or result is not an object")
        return cls(
            container_id=strs["containerid"],
            ifname=strs["ifname"],
            network_name=strs["networkname"],
            config=config,
            netns=strs["netns"],
            cni_args=[(k, v) for k, v in args],
            capability_args=caps,
            result=result or None,
            path=path,
        )


class ResultCache:
    def __init__(self, cache_dir: str = DEFAULT_CACHE_DIR, *, remove_soon: bool = False) -> None:
        """`remove_soon`: the daemon's (its loop outlives a delete): an entry is renamed into
        `deleted_dir`, unlinked there later. A tool's (the dir may be libcni's): at once."""
        self.cache_dir = cache_dir
        self.results_dir = os.path.join(cache_dir, "results")
        self.deleted_dir = os.path.join(cache_dir, "results-deleted")
        self._trash = self.deleted_dir if remove_soon else ""  # files.remove_soon's
        self._syncer: _Syncer | None = None

    def path(self, network: str, container_id: str, ifname: str) -> str:
        """Raises ConfigError for names no entry can have (empty, or with '/' or NUL)."""
        for part in (network, container_id, ifname):
            # DEL does not validate IDs (libcni doesn't); never let one leave the directory
            if not part or "/" in part or "\0" in part:
                raise ConfigError(f"cannot name a cache file after {part!r}", location=self.results_dir)
        try:
            return files.child(self.results_dir, f"{network}-{container_id}-{ifname}")
        except files.UnsafePath as exc:
            raise ConfigError(str(exc), location=self.results_dir) from None

    def write(self, entry: CacheEntry, *, durable: bool = True) -> None:
        """Atomic (readers see the old entry or the new one, never a part); raises
        CNIError(IO_FAILURE) and leaves no partial file.

        durable: on disk when this returns (fsync, rename, directory fsync). Without it the fsyncs are left to
        sync() or sync_later(): a power loss before then can leave the entry missing or empty, which read()
        reports as corrupt and DEL tolerates."""
        prepared = self.prepare(entry)
        prepared.commit(entry.result, durable=durable)

    def prepare(self, entry: CacheEntry) -> PreparedWrite:
        """The write of `entry` with its result still to come (PreparedWrite)."""
        return PreparedWrite(self, entry)

    def _create(self, path: str) -> AtomicFile:
        return files.atomic_in(path, self.cache_dir, self.results_dir)  # 0700 whatever the umask

    def sync_later(self, network: str, container_id: str, ifname: str) -> None:
        """sync() on a background thread, soon: an ADD need not wait for the journal commit
        (0.5-3 ms here). Failures are logged."""
        if self._syncer is None:
            self._syncer = _Syncer(self)
        self._syncer.submit((network, container_id, ifname))

    def flush(self, timeout: float = 10.0) -> bool:
        """Blocks until every sync_later() so far is done (before the process exits: the
        thread does not hold it up). False if that took longer than `timeout`."""
        return self._syncer is None or self._syncer.flush(timeout)

    def sync(self, network: str, container_id: str, ifname: str, *, directory: bool = True) -> None:
        """Makes an entry written with durable=False durable; one deleted meanwhile is fine.
        directory=False leaves the directory's fsync (the rename) to a later call."""
        path = self.path(network, container_id, ifname)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return
        except OSError as exc:
            raise _io_failure("sync", path, exc) from exc
        try:
            os.fsync(fd)
            if directory:
                fsync_dir(self.results_dir)
        except OSError as exc:
            raise _io_failure("sync", path, exc) from exc
        finally:
            os.close(fd)

    def read(
        self, network: str, container_id: str, ifname: str, *, drop_corrupt: bool = False
    ) -> CacheEntry | None:
        """The entry, or None when it is missing or corrupt (a warning is logged for a corrupt
        one, which `drop_corrupt` also removes, as libcni's list DEL does)."""
        try:
            path = self.path(network, container_id, ifname)
            with open(path, "rb") as f:
                data = f.read()
        except (FileNotFoundError, ConfigError):
            return None
        except OSError as exc:
            log.warning("cannot read CNI cache file %s: %s", path, exc.strerror)
            return None
        try:
            return CacheEntry.from_json(data, path)
        except CorruptEntry as exc:
            log.warning(
                "ignoring corrupt CNI cache file %s: %s%s", path, exc, " (removed)" if drop_corrupt else ""
            )
            if drop_corrupt:
                self._unlink(path)
            return None

    def delete(self, network: str, container_id: str, ifname: str) -> None:
        """Removes an entry; a missing one is fine, a failure is logged (GC retries later)."""
        try:
            path = self.path(network, container_id, ifname)
        except ConfigError:
            return  # no entry can have this name
        self._unlink(path)

    def count(self) -> int:
        """How many entries the cache holds, by their file names (none is opened: what
        `nri-cni status` shows, asked often; a file `entries` would skip as unreadable counts)."""
        try:
            with os.scandir(self.results_dir) as it:
                return sum(1 for d in it if not d.name.startswith(".") and d.is_file(follow_symlinks=False))
        except OSError:
            return 0

    def entries(self, container_id: str | None = None, network: str | None = None) -> list[CacheEntry]:
        """Valid entries, sorted by file name; unreadable or foreign files are skipped."""
        try:
            names = os.listdir(self.results_dir)
        except OSError:
            return []
        out = []
        part = f"-{container_id}-" if container_id else ""
        # a pod's few names picked in one pass before any is looked at ("" is in every name):
        # sorting and checking every entry of a node's hundreds cost more than the listing
        for name in sorted([name for name in names if part in name]):
            if name.startswith("."):  # our temp files
                continue
            if part:
                pos = name.find(part)
                if pos <= 0 or pos + len(part) >= len(name):
                    continue
            path = os.path.join(self.results_dir, name)
            try:
                with open(path, "rb") as f:
                    entry = CacheEntry.from_json(f.read(), path)
            except (OSError, CorruptEntry):
                continue
            if not (entry.container_id and entry.ifname and entry.network_name):
                continue
            if container_id and entry.container_id != container_id:
                continue
            if network is not None and entry.network_name != network:
                continue
            out.append(entry)
        return out

    def close(self) -> None:
        """The daemon stops: the deleted entries whose unlink is still due go now."""
        files.empty(self.deleted_dir)

    def _unlink(self, path: str) -> None:
        try:
            files.remove_soon(path, self._trash)
        except OSError as exc:
            log.warning("cannot remove CNI cache file %s: %s", path, exc.strerror)


class PreparedWrite:
    """The cache write of one attachment, split so that most of it happens before the result
    is known: CNIRuntime.add calls prepare() while the chain's last plugin runs (serialising
    every field but the result, creating the temporary file), and commit(result) afterwards is
    one write and a rename. discard() removes whatever prepare() made; commit() does all of
    it if prepare() never ran. Not thread-safe: one event loop uses it."""

    def __init__(self, cache: ResultCache, entry: CacheEntry) -> None:
        self.cache = cache
        self.entry = entry
        self._begun: tuple[str, AtomicFile] | None = None  # every field but the result, the file
        self._done = False

    def prepare(self) -> None:
        """Best effort: whatever fails here is done again, and reported, by commit()."""
        if self._done or self._begun is not None:
            return
        try:
            self._begun = self._begin(self._path())
        except (OSError, ConfigError):
            pass

    def commit(self, result: dict[str, Any] | None, *, durable: bool = True) -> None:
        """Writes the entry with `result`; raises CNIError(IO_FAILURE) (or ConfigError for an
        impossible name) and then leaves no temporary file."""
        if self._done:
            raise RuntimeError("cache write already committed or discarded")
        path = self._path()
        try:
            if self._begun is None:
                self._begun = self._begin(path)
            head, file = self._begun
            data = (head + _result_tail(result)).encode()
            self._begun, self._done = None, True
            file.commit(data, durable=durable)
        except OSError as exc:
            self.discard()
            raise _io_failure("write", path, exc) from exc

    def _path(self) -> str:
        return self.cache.path(self.entry.network_name, self.entry.container_id, self.entry.ifname)

    def _begin(self, path: str) -> tuple[str, AtomicFile]:
        return self.entry._head(), self.cache._create(path)

    def discard(self) -> None:
        self._done = True
        if self._begun is not None:
            file, self._begun = self._begun[1], None
            file.abort()


class _Syncer:
    """One thread that makes entries durable after the fact (ResultCache.sync_later).
    Entries queued together share one directory fsync."""

    def __init__(self, cache: ResultCache) -> None:
        self.cache = cache
        self.queue: queue.SimpleQueue[tuple[str, str, str] | threading.Event] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name="nri-cni-cache-sync", daemon=True)
        self.thread.start()

    def submit(self, key: tuple[str, str, str]) -> None:
        self.queue.put(key)

    def flush(self, timeout: float) -> bool:
        """Waits until everything submitted before is durable; False on timeout."""
        done = threading.Event()
        self.queue.put(done)
        return done.wait(timeout)

    def _run(self) -> None:
        while True:
            batch = [self.queue.get()]
            while True:
                try:
                    batch.append(self.queue.get_nowait())
                except queue.Empty:
                    break
            waiters = [item for item in batch if isinstance(item, threading.Event)]
            self._sync([item for item in batch if not isinstance(item, threading.Event)])
            for done in waiters:
                done.set()

    def _sync(self, batch: list[tuple[str, str, str]]) -> None:
        if not batch:
            return
        for key in batch:
            try:
                self.cache.sync(*key, directory=False)
            except CNIError as exc:
                log.warning("CNI cache entry not made durable: %s (%s)", exc.msg, exc.details)
        try:
            fsync_dir(self.cache.results_dir)  # the renames
        except OSError as exc:
            log.warning(
                "CNI cache directory %s not made durable: %s", self.cache.results_dir, exc.strerror or exc
            )
