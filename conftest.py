# The repo root on sys.path, so that tests import their shared helpers as `tests.support...`
# however pytest is started.
