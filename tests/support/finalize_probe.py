"""A FINALIZE drop-in that records, per call, "VERB pod ifname links," (the pod's interfaces
when FINALIZE ran, sorted, each followed by a comma) in a log file; it prints nothing."""

from __future__ import annotations

from pathlib import Path

from tests.support.nricni import ShimSetup

FINALIZE_PROBE = """#!/bin/sh
# FINALIZE probe: records which interfaces the pod has when FINALIZE runs; prints nothing.
cat >/dev/null
links=$(nsenter --net="$CNI_NETNS" ip -o link show | awk -F': ' '{print $2}' | cut -d@ -f1 | sort | tr '\\n' ,)
echo "$CNI_COMMAND $CNI_CONTAINERID $CNI_IFNAME $links" >> "%s"
"""


def install_finalize_probe(setup: ShimSetup, log: Path) -> None:
    """The probe as plugin `fin-probe` in the setup's bin dir, and its drop-in 50-probe.conf."""
    (setup.bin_dir / "fin-probe").write_text(FINALIZE_PROBE % log)
    (setup.bin_dir / "fin-probe").chmod(0o755)
    (setup.finalize_dir / "50-probe.conf").write_text('{"type": "fin-probe"}')
