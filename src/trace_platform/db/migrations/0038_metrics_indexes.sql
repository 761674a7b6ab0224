-- The sink's backlog for /metrics (db/sql/metrics.sql sink_backlog): the pending batches of
-- each buffered dataset, off an index of those alone. buffer_records keeps every batch ever
-- published (loaded and dead ones stay for their users), so counting the pending ones without
-- it would read the whole history at every scrape. Partial: a batch leaves it when loaded.
CREATE INDEX buffer_records_pending_idx ON buffer_records (dataset_uuid, created_at)
  WHERE status = 'pending';
