-- A published Postgres dataset may be the hot window of a published Parquet dataset: the Query
-- Service then serves the cold name as one view, hot rows plus cold rows below the window.
ALTER TABLE datasets
  ADD COLUMN hot_window_of  UUID REFERENCES datasets,
  ADD COLUMN hot_window_key TEXT;

-- Postgres views named like the published Postgres datasets (the sink keeps them current).
CREATE SCHEMA IF NOT EXISTS published;
