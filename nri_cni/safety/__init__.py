"""What keeps untrusted input and a shared node from hurting the daemon: files written atomically
and trusted only when safe (files.py), size and depth limits on JSON from outside
(jsonlimits.py), validation of ids, names and CNI args (validate.py), and log lines about what
outsiders do at a bounded rate (ratelog.py). The bottom of the package: it imports only errors."""
