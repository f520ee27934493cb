"""The CNI runtime: what libcni does inside containerd, in asyncio.

config   conflists: loading, validation, version negotiation
result   CNI results of every released version, converted to and from 1.1.0
cache    libcni's on-disk attachment cache, byte-compatible
exec     running one plugin binary (fast spawn, timeouts, bounded output)
runtime  the verbs: ADD, CHECK, DEL, FINALIZE, STATUS, GC, VERSION

Nothing is imported here so that `import nri_cni.cni.result` stays cheap.
"""
