"""What is really on the node: the pods' interfaces as netlink shows them.

`NodeInspector` compares expected attachments (netns, ifname, addresses, MAC, host-side links) with
the kernel's view and returns one `Finding` per attachment; `VerifyPolicy` decides when a round
also runs the chain's CNI CHECK. This package knows nothing of NRI, the daemon or the pod plan: the
caller builds the expectations (from its records and the CNI results) and acts on the findings.
Netlink is spoken over plain sockets (rtnl.py): pyroute2, ~155 ms and ~10 MiB to import, is not
loaded by the daemon (tests check the encoding against it).
"""

from nri_cni.node.hostside import host_side_wants, with_host_side
from nri_cni.node.inspector import NodeInspector
from nri_cni.node.model import Difference, Expectation, Finding, FindingKind, expectation_from_result
from nri_cni.node.policy import VerifyPolicy

__all__ = [
    "Difference",
    "Expectation",
    "Finding",
    "FindingKind",
    "NodeInspector",
    "VerifyPolicy",
    "expectation_from_result",
    "host_side_wants",
    "with_host_side",
]
