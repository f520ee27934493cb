"""What the pod plan needs from outside that lives above it, as types: the plan is given these
at construction (nri_cni/daemon/app.py build_daemon) and never looks anything up."""

from __future__ import annotations

from typing import Protocol

from nri_cni.pod.oprecord import NoSink, OperationSink

__all__ = ["NoSink", "OperationSink", "Readiness"]


class Readiness(Protocol):
    """status.refuse_when_not_ready: asked only for the networks an ADD is about to attach."""

    async def ready(self, network: str) -> str:
        """ "" when the network is ready, else its STATUS error."""
        ...
