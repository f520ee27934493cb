"""The lifecycle fixtures (tests/support/lifecycle.py): `world`, a bin dir with the lifecycle plugin."""

from tests.support.lifecycle import world  # noqa: F401
