"""A second test image: Debian bookworm's static busybox, for containers that run a command.

`apt-get download busybox-static` (never installed), `dpkg-deb -x` into a temp dir, and the one
binary packed like the pause image (tests/support/pause/image.py) as /bin/busybox; a container
runs `/bin/busybox <applet> ...`. Built once into `<repo>/.cache/busybox/<key>/` (the key: the
.deb's name, which carries its version) and reused.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

from tests.support.pause.image import DEFAULT_CACHE, PauseImage, go_arch, pack_files

IMAGE_NAME = "localhost/nri-cni-test/busybox"
PACKAGE = "busybox-static"
BUSYBOX = "/bin/busybox"


def build_busybox_image(cache_dir: Path | None = None) -> PauseImage:
    cache_dir = Path(cache_dir) if cache_dir is not None else DEFAULT_CACHE
    root = cache_dir / "busybox"
    root.mkdir(parents=True, exist_ok=True)
    for meta_path in sorted(root.glob("*/image.json")):
        meta = json.loads(meta_path.read_text())
        return PauseImage(
            meta_path.parent / "busybox.oci.tar", meta["ref"], meta["manifest_digest"], meta["config_digest"]
        )
    work = Path(tempfile.mkdtemp(prefix=".busybox-", dir=root))
    try:
        subprocess.run(
            ["apt-get", "download", PACKAGE], cwd=work, check=True, capture_output=True, timeout=300
        )
        (deb,) = work.glob("*.deb")
        subprocess.run(["dpkg-deb", "-x", str(deb), str(work / "x")], check=True, capture_output=True)
        binary = (work / "x" / "bin" / "busybox").read_bytes()
        key = hashlib.sha256(deb.name.encode() + b"\0" + go_arch().encode()).hexdigest()[:16]
        ref = f"{IMAGE_NAME}:{key}"
        image = pack_files(
            {BUSYBOX.lstrip("/"): (binary, 0o755)},
            ref,
            work / "busybox.oci.tar",
            entrypoint=[BUSYBOX],
            arch=go_arch(),
            history=("nri-cni tests/support/busybox", deb.name),
        )
        (work / "image.json").write_text(
            json.dumps(
                {"ref": ref, "manifest_digest": image.manifest_digest, "config_digest": image.config_digest}
            )
        )
        deb.unlink()
        shutil.rmtree(work / "x")
        final = root / key
        try:
            os.rename(work, final)
        except OSError:
            if not (final / "image.json").is_file():
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return build_busybox_image(cache_dir)


def pod_for_containers(cri) -> tuple[str, object]:
    """A pod for containers; (its id, its sandbox config)."""
    name, uid = f"victim-{uuid.uuid4().hex[:8]}", str(uuid.uuid4())
    pod = cri.run_pod(name, "nct-e2e", uid)
    return pod, cri.pod_config(name, "nct-e2e", uid)


def status_reading_container(cri, pod: str, sandbox, image) -> tuple[str, list]:
    """A running busybox container in the pod; (its id, what it reads in its status file)."""
    cid = cri.create_container(
        pod, sandbox, f"app-{uuid.uuid4().hex[:6]}", image.ref, [BUSYBOX, "sleep", "100000"]
    )
    cri.start_container(cid)
    code, out, err = cri.exec_sync(cid, [BUSYBOX, "cat", "/run/nri-cni/network-status.json"])
    assert code == 0, err
    return cid, json.loads(out)
