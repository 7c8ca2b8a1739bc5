"""The admin HTTP API, its security, the Prometheus metrics and the web console."""
