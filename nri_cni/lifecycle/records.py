"""Generation records: what survives a restart of nri-cni about INIT and DEINIT.

One file per network generation, <state_dir>/networks/<network>/<generation>.json, holding the
exact config bytes (DEINIT needs the config of a network that may be gone from every config
file by then) and the phase:

  init    an INIT was started and has not succeeded yet (failed, or interrupted by a crash)
  ready   INIT succeeded; DEINIT has not started
  deinit  a DEINIT was started and has not succeeded yet

The record is written before the verb runs and removed after DEINIT succeeded, so a crash at
any point leaves enough to finish the job: a restart re-runs the verb of the phase it finds.
Writes are atomic and durable, as the intent records are.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import time
from dataclasses import dataclass

from nri_cni.errors import CniCode, NriCniError
from nri_cni.safety.files import fsync_dir, write_atomic

log = logging.getLogger(__name__)

PHASES = ("init", "ready", "deinit")


@dataclass
class GenerationRecord:
    network: str
    generation: str
    config: bytes
    phase: str
    updated: float = 0.0
    error: str = ""  # the last failure of the phase's verb


class RecordStore:
    def __init__(self, state_dir: str) -> None:
        self.dir = os.path.join(state_dir, "networks")

    def _path(self, network: str, generation: str) -> str:
        return os.path.join(self.dir, network, f"{generation}.json")

    def write(self, rec: GenerationRecord) -> None:
        rec.updated = time.time()
        doc = {
            "network": rec.network,
            "generation": rec.generation,
            "phase": rec.phase,
            "config": base64.b64encode(rec.config).decode(),
            "updated": round(rec.updated, 3),
            "error": rec.error,
        }
        path = self._path(rec.network, rec.generation)
        try:
            os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
            write_atomic(path, json.dumps(doc, separators=(",", ":")).encode())
        except OSError as exc:
            raise NriCniError(
                f"cannot write the lifecycle record {path}: {exc.strerror}", cni_code=CniCode.IO_FAILURE
            ) from exc

    def remove(self, network: str, generation: str) -> None:
        path = self._path(network, generation)
        try:
            os.unlink(path)
        except FileNotFoundError:
            return
        parent = os.path.dirname(path)
        try:
            os.rmdir(parent)  # the network's last generation: leave no empty directory
        except OSError:
            _fsync_dir_if_there(parent)

    def load_all(self) -> list[GenerationRecord]:
        out: list[GenerationRecord] = []
        try:
            networks = sorted(os.listdir(self.dir))
        except FileNotFoundError:
            return out
        for network in networks:
            netdir = os.path.join(self.dir, network)
            try:
                names = sorted(os.listdir(netdir))
            except (NotADirectoryError, FileNotFoundError):
                continue
            for name in names:
                path = os.path.join(netdir, name)
                if name.startswith("."):  # a write_atomic cut by a crash: the old record (if any) stands
                    os.unlink(path)
                    continue
                try:
                    with open(path, "rb") as f:
                        doc = json.loads(f.read())
                    rec = GenerationRecord(
                        network=doc["network"],
                        generation=doc["generation"],
                        config=base64.b64decode(doc["config"], validate=True),
                        phase=doc["phase"],
                        updated=float(doc.get("updated", 0)),
                        error=str(doc.get("error", "")),
                    )
                    if rec.phase not in PHASES or rec.network != network or name != f"{rec.generation}.json":
                        raise ValueError("fields do not match the file")
                except (OSError, ValueError, KeyError, TypeError) as exc:
                    # Kept for a person to look at: deleting it would forget a DEINIT owed.
                    log.error("lifecycle record %s is unreadable (%s); ignored", path, exc)
                    continue
                out.append(rec)
        return out


def _fsync_dir_if_there(path: str) -> None:
    """Best effort after a removal: the directory may be gone or unreadable by now."""
    try:
        fsync_dir(path)
    except OSError:
        pass
