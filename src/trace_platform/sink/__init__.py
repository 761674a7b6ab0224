"""The trusted sink of buffered Postgres datasets: validates the batches producers published
and upserts them idempotently (`batch.py` reads and checks, `service.py` leases and lands)."""
