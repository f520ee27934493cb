"""The lifecycle fixtures (tests/support/lifecycle.py): `lnode`, a whole node with spied-on real plugins."""

from tests.support.lifecycle import lnode  # noqa: F401
