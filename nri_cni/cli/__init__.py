"""The `nri-cni` command line: the root parser (main.py), the daemon's commands and its client's
(daemon.py, with `status` verdicts in health.py and the `pods`/`verify` tables in tables.py), the
cnitool verbs (cnitool.py), and the daemon process's setup (logsetup.py, gctune.py).

Nothing is imported here: `nri-cni --help` imports only the root parser and its command modules."""
