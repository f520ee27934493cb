"""Optional Prometheus metrics: what is collected and how it renders (families.py,
prometheus_client), the endpoint on a unix socket or 127.0.0.1 (endpoint.py: `Metrics`, the
plan's OperationSink, and a minimal HTTP/1.1 responder), and the endpoint's limits and
background collection (limits.py)."""
