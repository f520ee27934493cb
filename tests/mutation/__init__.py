"""Mutation testing of the decision modules (mutmut): `python -m tests.mutation [MODULE...]`."""
