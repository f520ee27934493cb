"""Running coroutines and short socket paths (tests/support/aio.py)."""

from tests.support.aio import arun, sock_dir  # noqa: F401
