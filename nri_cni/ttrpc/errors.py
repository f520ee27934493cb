"""The one error the ttrpc state machines raise."""

from __future__ import annotations

from nri_cni.errors import ProtocolError


class TtrpcProtocolError(ProtocolError):
    """The byte stream broke the ttrpc protocol (or we were asked to send something it forbids).

    The connection cannot be trusted afterwards: the decoder that raised it keeps raising it.
    """
