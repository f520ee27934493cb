"""The test pods' sandbox image, made without a registry.

``pause.c`` is compiled statically and packed into a one-layer OCI image archive
(an ``oci-layout`` tar) that ``ctr images import`` accepts. The archive is built once
per source/compiler combination into ``<repo>/.cache/pause/<key>/`` and reused.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

SOURCE = Path(__file__).with_name("pause.c")
REPO_ROOT = Path(__file__).resolve().parents[3]
DEFAULT_CACHE = REPO_ROOT / ".cache"
IMAGE_NAME = "localhost/nri-cni-test/pause"

MT_LAYOUT_INDEX = "application/vnd.oci.image.index.v1+json"
MT_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MT_CONFIG = "application/vnd.oci.image.config.v1+json"
MT_LAYER = "application/vnd.oci.image.layer.v1.tar"
REF_NAME_ANNOTATION = "org.opencontainers.image.ref.name"


@dataclass(frozen=True)
class PauseImage:
    archive: Path  # the OCI archive to import
    ref: str  # full image reference recorded in the archive (and the sandbox image to pin)
    manifest_digest: str
    config_digest: str


def _gcc_version(cc: str) -> str:
    out = subprocess.run([cc, "--version"], capture_output=True, text=True, check=True)
    return out.stdout.splitlines()[0]


def _json_bytes(obj: object) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _tar_add(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = mode
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    tar.addfile(info, io.BytesIO(data))


def _layer_tar(files: dict[str, tuple[bytes, int]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, (data, mode) in files.items():
            _tar_add(tar, name, data, mode=mode)
    return buf.getvalue()


def pack_oci_archive(binary: bytes, ref: str, dest: Path, *, arch: str = "amd64") -> PauseImage:
    """Write a one-layer OCI image archive holding ``binary`` at /pause to ``dest``."""
    return pack_files(
        {"pause": (binary, 0o755)},
        ref,
        dest,
        entrypoint=["/pause"],
        arch=arch,
        history=("nri-cni tests/support/pause", "static pause"),
    )


def pack_files(
    files: dict[str, tuple[bytes, int]],
    ref: str,
    dest: Path,
    *,
    entrypoint: list[str],
    arch: str = "amd64",
    history: tuple[str, str],
) -> PauseImage:
    """Write a one-layer OCI image archive holding `files` (path in the image -> (bytes,
    mode)) to ``dest``; `history`: its (created_by, comment)."""
    layer = _layer_tar(files)
    layer_digest = _digest(layer)  # uncompressed layer: its diff_id is its digest
    config = _json_bytes(
        {
            "architecture": arch,
            "os": "linux",
            "config": {"Entrypoint": entrypoint, "WorkingDir": "/"},
            "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
            "history": [{"created_by": history[0], "comment": history[1]}],
        }
    )
    config_digest = _digest(config)
    manifest = _json_bytes(
        {
            "schemaVersion": 2,
            "mediaType": MT_MANIFEST,
            "config": {"mediaType": MT_CONFIG, "digest": config_digest, "size": len(config)},
            "layers": [{"mediaType": MT_LAYER, "digest": layer_digest, "size": len(layer)}],
        }
    )
    manifest_digest = _digest(manifest)
    index = _json_bytes(
        {
            "schemaVersion": 2,
            "mediaType": MT_LAYOUT_INDEX,
            "manifests": [
                {
                    "mediaType": MT_MANIFEST,
                    "digest": manifest_digest,
                    "size": len(manifest),
                    "platform": {"architecture": arch, "os": "linux"},
                    "annotations": {REF_NAME_ANNOTATION: ref},
                }
            ],
        }
    )
    with tarfile.open(dest, mode="w", format=tarfile.PAX_FORMAT) as tar:
        _tar_add(tar, "oci-layout", _json_bytes({"imageLayoutVersion": "1.0.0"}))
        _tar_add(tar, "index.json", index)
        for blob in (layer, config, manifest):
            _tar_add(tar, "blobs/sha256/" + _digest(blob).removeprefix("sha256:"), blob)
    return PauseImage(archive=dest, ref=ref, manifest_digest=manifest_digest, config_digest=config_digest)


def go_arch() -> str:
    machine = os.uname().machine
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(machine, machine)


def build_pause_image(cache_dir: Path | None = None, *, cc: str = "gcc") -> PauseImage:
    """Compile pause.c and pack it, or return the cached archive for the same inputs."""
    cache_dir = Path(cache_dir) if cache_dir is not None else DEFAULT_CACHE
    source = SOURCE.read_bytes()
    key = hashlib.sha256(source + b"\0" + _gcc_version(cc).encode() + b"\0" + go_arch().encode()).hexdigest()[
        :16
    ]
    ref = f"{IMAGE_NAME}:{key}"
    final = cache_dir / "pause" / key
    meta_path = final / "image.json"
    if meta_path.is_file():
        meta = json.loads(meta_path.read_text())
        return PauseImage(
            archive=final / "pause.oci.tar",
            ref=meta["ref"],
            manifest_digest=meta["manifest_digest"],
            config_digest=meta["config_digest"],
        )
    final.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=final.parent))
    try:
        binary = work / "pause"
        proc = subprocess.run(
            [cc, "-static", "-Os", "-Wall", "-Wextra", "-Werror", "-s", "-o", str(binary), str(SOURCE)],
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"compiling {SOURCE} failed:\n{proc.stderr}")
        image = pack_oci_archive(binary.read_bytes(), ref, work / "pause.oci.tar", arch=go_arch())
        (work / "image.json").write_text(
            json.dumps(
                {
                    "ref": image.ref,
                    "manifest_digest": image.manifest_digest,
                    "config_digest": image.config_digest,
                }
            )
        )
        try:
            os.rename(work, final)
        except OSError:
            if not meta_path.is_file():  # not a concurrent build that won the race
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return build_pause_image(cache_dir, cc=cc)
