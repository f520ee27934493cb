"""nri-cni: an NRI plugin that runs CNI networks for pods.

Kept empty on purpose: the shim and the CLI import only what they use.
"""

__version__ = "0.1.0"
