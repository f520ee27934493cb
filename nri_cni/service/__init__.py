"""The pod service: every pod operation enters the pod service (service.py), whatever
reached the daemon (an NRI event, a shim call, the CLI, a timer). It owns the pod roster
(roster.py), per-pod serialization and the GC exclusion, and asks the mode (modes.py) the
questions that differ between shim, secondary and native mode."""
