"""A FINALIZE drop-in that records, per call, "VERB pod ifname links" (the pod's interfaces when
FINALIZE ran, sorted and joined by commas) in a log file; it prints nothing."""

from __future__ import annotations

from pathlib import Path

from tests.support.bin_dir import install_plugin
from tests.support.nricni import ShimSetup

FINALIZE_PROBE = """#!/bin/sh
# FINALIZE probe: records which interfaces the pod has when FINALIZE runs; prints nothing.
cat >/dev/null
links=$(nsenter --net="$CNI_NETNS" ip -o link show | awk -F': ' '{print $2}' | cut -d@ -f1 | sort | paste -sd, -)
echo "$CNI_COMMAND $CNI_CONTAINERID $CNI_IFNAME $links" >> "%s"
"""


def install_finalize_probe(setup: ShimSetup, log: Path) -> None:
    """The probe as plugin `fin-probe` in the setup's bin dir, and its drop-in 50-probe.conf."""
    install_plugin(setup.bin_dir, "fin-probe", FINALIZE_PROBE % log)
    (setup.finalize_dir / "50-probe.conf").write_text('{"type": "fin-probe"}')


def probe_calls(log: Path, pod: str) -> list[tuple[str, str, str]]:
    """(verb, CNI_IFNAME, links) of every probe call for `pod`, in order."""
    if not log.exists():
        return []
    out = []
    for line in log.read_text().splitlines():
        verb, cid, ifname, links = (line.split(" ", 3) + [""])[:4]
        if cid == pod:
            out.append((verb, ifname, links))
    return out
