"""What the image holds, printed by config/image/build.sh: run with the image's own python3
(standard library only), inside the image: `podman run -i IMAGE python3 - < describe.py`."""

from __future__ import annotations

import os
import struct
import subprocess
import sys

SHIM = "/opt/nri-cni/libexec/nri-cni-shim"
PLUGINS = "/usr/lib/cni"
PACKAGES = ("python3", "iptables", "nftables", "iproute2", "containernetworking-plugins")
PT_INTERP = 3


def elf_interpreter(path: str) -> str | None:
    """The program interpreter an ELF file names (PT_INTERP), None for a static one."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"\x7fELF" or data[4] != 2:
        raise ValueError(f"{path}: not a 64-bit ELF file")
    end = "<" if data[5] == 1 else ">"
    (phoff,) = struct.unpack_from(end + "Q", data, 0x20)
    phentsize, phnum = struct.unpack_from(end + "HH", data, 0x36)
    for i in range(phnum):
        p_type, _flags, p_offset, _vaddr, _paddr, p_filesz = struct.unpack_from(
            end + "IIQQQQ", data, phoff + i * phentsize
        )
        if p_type == PT_INTERP:
            return data[p_offset : p_offset + p_filesz].rstrip(b"\0").decode()
    return None


def main() -> int:
    version = subprocess.run(["nri-cni", "--version"], capture_output=True, text=True, check=True)
    venv_python = os.path.realpath("/opt/nri-cni/bin/python")
    print(f"  nri-cni:  {version.stdout.strip()} (/opt/nri-cni)")
    print(f"  python:   {sys.version.split()[0]} ({venv_python})")
    interp = elf_interpreter(SHIM)
    kind = "static" if interp is None else f"dynamic, {interp}"
    print(f"  shim:     {SHIM}, {os.path.getsize(SHIM)} bytes, {kind}")
    query = ["dpkg-query", "-W", "-f", "${Package} ${Version}\\n", *PACKAGES]
    packages = subprocess.run(query, capture_output=True, text=True, check=True).stdout.split("\n")
    print(f"  debian:   {', '.join(p for p in packages if p)}")
    print(f"  plugins:  {' '.join(sorted(os.listdir(PLUGINS)))} ({PLUGINS})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
