"""Crash-safe ADD: an intent record is on disk before the first plugin of a pod's ADD runs.

libcni caches an attachment only after its whole chain succeeded, so an ADD interrupted by a
crash (or a kill -9) leaves resources that no cache entry points at, and no GC will ever find
them. nri-cni writes, atomically, the list of networks it is about to attach (with each
network's exact config bytes and args) before any plugin runs (fsynced while they, FINALIZE
and the netlink fill run, and before the record is cleared: attach.py), and removes the record
only once every network is cached or rolled back. At start-up every record left behind is
rolled back with DEL, network by network in reverse, using the config it holds: CNI DEL must
succeed for resources that were never created, so a DEL of a network that never got its ADD is
harmless.

A record also outlives a rollback that failed (a plugin's DEL failed): the rollback is then
retried by the pod's next DEL (runtime stop/remove), by every GC and at start-up, until it
succeeds. Under the pod's lock (or GC's exclusive lock) a record found on disk is therefore
always one nobody is working on: an ADD in progress holds the lock until its record is gone.

Doomed delete: a plugin whose ADD failed with an error meaning "nothing was created"
(`nothing_created()` in rollback.py) is recorded in the network's `doomed_plugins` as
"<index>:<type>"; a DEL failure of exactly that plugin for this attachment does not count.
"""

from __future__ import annotations

import asyncio
import base64
import errno
import json
import logging
import os
from dataclasses import dataclass, field
from typing import Any

from nri_cni.errors import Kind, NriCniError
from nri_cni.safety import files, jsonlimits, validate
from nri_cni.safety.files import fsync_dir, is_temporary

log = logging.getLogger(__name__)

# open(O_TMPFILE) where the file system has none: EOPNOTSUPP; EISDIR (kernels before 3.11)
NO_TMPFILE = frozenset({errno.EOPNOTSUPP, errno.EISDIR})


@dataclass
class IntendedNetwork:
    network: str
    ifname: str
    config: bytes
    cni_args: list[tuple[str, str]] = field(default_factory=list)
    capability_args: dict[str, Any] = field(default_factory=dict)
    # A plugin whose ADD failed with a code meaning "nothing was created" (doomed delete):
    # its DEL failure for this attachment is not reported. "<index>:<type>" per plugin.
    doomed_plugins: list[str] = field(default_factory=list)

    def doomed_indexes(self) -> set[int]:
        out = set()
        for item in self.doomed_plugins:
            index, _, _ = item.partition(":")
            if index.isdigit():
                out.add(int(index))
        return out


@dataclass
class Intent:
    pod_id: str
    netns: str
    networks: list[IntendedNetwork]
    # "" while the ADD runs; the reason once its rollback failed and waits for a retry
    rollback_error: str = ""


class IntentStore:
    """`intents/` holds the records. In the daemon (`remove_soon`) a record is cleared by a
    rename into `intents-cleared/`, its file unlinked there on a worker thread a moment later
    (files.remove_soon): an unlink on a pod's path waited for the file system (0.3-0.8 ms,
    strace -T of the daemon beside CRI-O's pods, where a rename took 0.05), and the clear is the
    ADD's last step before its answer. Start-up removes what a kill left there (`load_all`),
    the daemon's stop what is still due (`close`). Elsewhere (a tool) it is unlinked at once.

    A new record is written into a file made ahead (files.Unnamed: no name until it is the
    record, nothing left by a kill) on a worker thread once the record before it is durable
    (after its sync, while that ADD's plugins run), where the daemon runs: the file's creation
    waited for the file system on the ADD's path before its first plugin (0.5-1 ms beside
    CRI-O's pods, against 0.02-0.15 ms for the data and the name), and made at once beside the
    write it held up that plugin's spawn instead. A record rewritten (a rollback's) or written
    while none is ready goes the usual way (files.AtomicFile), as does every record where the
    file system makes none (no O_TMPFILE)."""

    def __init__(self, state_dir: str, *, remove_soon: bool = False) -> None:
        self.dir = os.path.join(state_dir, "intents")
        self.cleared_dir = os.path.join(state_dir, "intents-cleared")
        self._trash = self.cleared_dir if remove_soon else ""  # files.remove_soon's
        self._checked = False  # the directory made private, or fixed, by this store's first write
        # the pods with a record, known once load_all() read the directory (start-up, before
        # anything is served): from then on only this store writes and clears records, so a
        # load() of any other pod needs no look (an open that fails: 0.1-0.2 ms cold, in every
        # ADD and in the CHECK after it); every listing (pod_ids: GC, verify) adds what it finds
        self._held: set[str] = set()
        self._listed = False
        self._ahead: files.Unnamed | None = None  # the next new record's file, made ahead
        self._making = False  # a worker thread makes it
        self._no_ahead = False  # the file system made none: every record goes the usual way

    def _path(self, pod_id: str) -> str:
        # the file is named after the pod: it can never leave the directory (nri_cni/safety/validate.py)
        return os.path.join(self.dir, validate.check_id(pod_id, "pod id"))

    def write(self, intent: Intent, *, durable: bool = True) -> None:
        """Atomic; durable (fsynced) unless `durable=False`, then sync() makes it so. The
        directory is made 0700 (or fixed) at the store's first record, made again when it was
        removed, and not looked at otherwise (a mkdir and two stats, 0.12 ms cold)."""
        if not self._checked:
            files.private_dir(self.dir)
            self._checked = True
        doc = {
            "podId": intent.pod_id,
            "netns": intent.netns,
            "rollbackError": intent.rollback_error,
            "networks": [
                {
                    "network": n.network,
                    "ifName": n.ifname,
                    "config": base64.b64encode(n.config).decode(),
                    "cniArgs": [list(kv) for kv in n.cni_args],
                    "capabilityArgs": n.capability_args,
                    "doomedPlugins": n.doomed_plugins,
                }
                for n in intent.networks
            ],
        }
        data = json.dumps(doc, separators=(",", ":")).encode()
        path = self._path(intent.pod_id)
        self._held.add(intent.pod_id)  # before: a write that fails costs at most a look for nothing
        try:
            self._put(path, data, durable)
        except OSError as exc:
            raise NriCniError(f"cannot write the intent record {path}: {exc.strerror}", kind=Kind.IO) from exc
        finally:
            if durable:
                self._make_ahead()

    def _put(self, path: str, data: bytes, durable: bool) -> None:
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            try:
                ahead.publish(path, data, durable=durable)
                return
            except OSError as exc:  # the record exists (rewritten), or its directory went
                log.debug("intent record %s: not in the file made ahead (%s)", path, exc.strerror or exc)
        files.atomic_in(path, self.dir).commit(data, durable=durable)

    def _make_ahead(self) -> None:
        """The next record's file, made on a worker thread; only where an event loop runs (the
        daemon), one at a time."""
        if self._ahead is not None or self._making or self._no_ahead:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # a tool: each record is created as it is written
        self._making = True
        made = loop.run_in_executor(None, files.Unnamed, self.dir)
        made.add_done_callback(self._made)

    def _made(self, made: asyncio.Future[files.Unnamed]) -> None:
        self._making = False
        exc = made.exception()
        if isinstance(exc, OSError) and exc.errno in NO_TMPFILE:
            self._no_ahead = True
            log.info("intent records: the file system of %s makes no file ahead (%s)", self.dir, exc.strerror)
        elif exc is not None:  # the directory went, out of descriptors: the next record tries again
            log.debug("intent records: no file made ahead: %s", exc)
        elif self._no_ahead:  # closed meanwhile
            made.result().close()
        else:
            self._ahead = made.result()

    def close(self) -> None:
        """The daemon stops: the file made ahead is let go, none is made any more, and the
        cleared records whose unlink is still due go now."""
        self._no_ahead = True
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            ahead.close()
        files.empty(self.cleared_dir)

    async def sync(self, pod_id: str) -> None:
        """Makes a record written with durable=False durable: the file and its rename, both
        fsynced at once (two threads): one journal commit serves both, where the directory's
        fsync after the file's waited for a second one (ext4 here: 4.7 -> 1.1 ms, medians).
        Then the next record's file is made ahead."""
        path = self._path(pod_id)
        try:
            await asyncio.gather(asyncio.to_thread(_fsync_file, path), asyncio.to_thread(fsync_dir, self.dir))
        except OSError as exc:
            raise NriCniError(f"cannot sync the intent record {path}: {exc.strerror}", kind=Kind.IO) from exc
        finally:
            self._make_ahead()

    def clear(self, pod_id: str) -> None:
        # the daemon's: the record is gone at once (a rename), its file a moment later
        files.remove_soon(self._path(pod_id), self._trash)
        self._held.discard(pod_id)  # after: a clear that failed leaves it held

    def pod_ids(self) -> list[str]:
        """Pods with a record (cheap: a directory listing); each is held from then on, so that
        a record this store did not write (none should be) is loaded by GC all the same."""
        try:
            names = sorted(n for n in os.listdir(self.dir) if not is_temporary(n))
        except FileNotFoundError:
            return []
        self._held.update(names)
        return names

    def load(self, pod_id: str) -> Intent | None:
        """The pod's record; None when there is none (or it was unreadable, and removed). After
        load_all(), a pod this store holds no record of is None without a look."""
        if self._listed and pod_id not in self._held:
            return None
        intent = self._read(self._path(pod_id))
        if intent is None:
            self._held.discard(pod_id)
        return intent

    def load_all(self) -> list[Intent]:
        files.empty(self.cleared_dir)  # cleared, not yet unlinked when a kill came
        out = []
        held = set()
        for name in sorted(_listing(self.dir)):
            path = os.path.join(self.dir, name)
            if is_temporary(name):
                # A crash while writing the record: no plugin had run yet.
                _unlink(path)
                continue
            intent = self._read(path)
            if intent is not None:
                out.append(intent)
                held.add(name)
        self._held, self._listed = held, True
        return out

    @staticmethod
    def _read(path: str) -> Intent | None:
        try:
            with open(path, "rb") as f:
                doc = jsonlimits.loads(f.read())
            if not validate.is_valid_id(doc["podId"]):
                raise ValueError(f"pod id {validate.quote(doc['podId'])} is not a valid id")
            return Intent(
                pod_id=doc["podId"],
                netns=doc.get("netns", ""),
                rollback_error=doc.get("rollbackError", ""),
                networks=[
                    IntendedNetwork(
                        network=n["network"],
                        ifname=n["ifName"],
                        config=base64.b64decode(n["config"]),
                        cni_args=[tuple(kv) for kv in n.get("cniArgs", [])],
                        capability_args=n.get("capabilityArgs", {}),
                        doomed_plugins=list(n.get("doomedPlugins", [])),
                    )
                    for n in doc["networks"]
                ],
            )
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            # Written atomically, so this is damage from outside; nothing to roll back with.
            log.error("intent record %s is unreadable (%s); removing it", path, exc)
            _unlink(path)
            return None


def _listing(directory: str) -> list[str]:
    try:
        return os.listdir(directory)
    except FileNotFoundError:
        return []


def _fsync_file(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
