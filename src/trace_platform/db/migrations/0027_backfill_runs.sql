-- A backfill (`trace dag backfill`) is a run of its own: the replayed scopes of chosen jobs.
ALTER TABLE trigger_fires DROP CONSTRAINT trigger_fires_kind_check;
ALTER TABLE trigger_fires ADD CONSTRAINT trigger_fires_kind_check
  CHECK (kind IN ('cron', 'webhook', 'manual', 'deploy', 'rollback', 'upstream', 'backfill'));
