-- A buffer batch's artifact is deleted by the collector (registry/collector.py) once its record
-- is settled and no other record of the same artifact still needs it: a loaded one after the
-- collector's grace, a dead one after collector_dead_batch_retention_seconds (kept that long
-- for its user to look at). `artifact_refused`: not a key the platform let the attempt write,
-- so never deleted (nor offered again).
ALTER TABLE buffer_records ADD COLUMN artifact_deleted_at TIMESTAMPTZ,
                           ADD COLUMN artifact_refused TEXT;
CREATE INDEX buffer_records_collectable_idx ON buffer_records (collectable_at)
  WHERE collectable_at IS NOT NULL AND artifact_deleted_at IS NULL AND artifact_refused IS NULL;
