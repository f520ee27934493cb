"""The daemon's local socket: the wire codec (codec.py, stdlib only: the standalone shim script
carries its text), the asyncio protocol and client (proto.py), and the server's guard (guard.py:
peer credentials, connection cap, read timeout, size cap).

Nothing is imported here: the shim imports codec.py alone."""
