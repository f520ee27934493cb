"""The daemon harness's fixtures (tests/support/harness.py): `node`, and loggers at INFO."""

from tests.support.harness import _quiet_loggers, node  # noqa: F401
