"""Prometheus metrics (docs/operations.md, "Metrics"): the API's, served on a port of its own
(`TRACE_METRICS_PORT`: `api.py`, its Postgres figures read at each scrape by `state.py`, its
request latencies timed by `http.py`), and each worker's (`TRACE_WORKER_METRICS_PORT`:
`worker.py`). Every process keeps its own `CollectorRegistry`, never the library's global one,
so processes and tests never share a series."""
