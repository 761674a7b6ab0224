-- What the API's /metrics reads at each scrape (metrics/state.py, docs/operations.md "Metrics").
-- Each statement reads an index or a small table, never a whole history table: a scrape every
-- 15 s must cost the database nothing it would notice. The caller bounds each one with a
-- statement_timeout besides.

-- name: live_tasks
-- Live tasks by status, exactly: task_status_live_idx holds these rows alone (migration 0019),
-- so the count reads the live work, not the finished history beside it.
SELECT status, count(*)::bigint AS n
FROM task_status
WHERE status IN ('queued', 'buffered', 'running')
GROUP BY status;

-- name: status_statistics
-- Every task_status partition's row estimate and its status column's most common values with
-- their frequencies, as its last ANALYZE (autovacuum's) saw them: what the planner estimates
-- from. Catalog rows only (one per partition). reltuples is -1 for a partition never analysed.
SELECT c.relname::text AS partition,
       c.reltuples::float8 AS reltuples,
       s.most_common_vals::text::text[] AS vals,
       s.most_common_freqs::float8[] AS freqs
FROM pg_inherits i
JOIN pg_class c ON c.oid = i.inhrelid
LEFT JOIN pg_stats s
  ON s.schemaname = c.relnamespace::regnamespace::name
 AND s.tablename = c.relname
 AND s.attname = 'status'
 AND NOT s.inherited
WHERE i.inhparent = 'task_status'::regclass;

-- name: pgqueue_messages
-- pgqueue's backlog by queue (queue_messages holds only what is not yet acked: its size is
-- the backlog itself): ready (visible, not leased, deliveries left), delayed (visible later),
-- leased in place; and how long the oldest ready message has been ready.
SELECT queue_name,
       count(*) FILTER (WHERE visible_at <= now() AND (lease_until IS NULL OR lease_until < now())
                          AND attempts < max_attempts)::bigint AS ready,
       count(*) FILTER (WHERE visible_at > now()
                          AND (lease_until IS NULL OR lease_until < now()))::bigint AS delayed,
       count(*) FILTER (WHERE lease_until >= now())::bigint AS leased,
       extract(epoch FROM now() - min(visible_at) FILTER (
         WHERE visible_at <= now() AND (lease_until IS NULL OR lease_until < now())
           AND attempts < max_attempts))::float8 AS oldest_ready_seconds
FROM queue_messages
GROUP BY queue_name;

-- name: pgqueue_leased_batches
-- Messages held by batch leases (migration 0024), by queue.
SELECT queue_name, coalesce(sum(cardinality(held)), 0)::bigint AS leased
FROM queue_leases
GROUP BY queue_name;

-- name: pgqueue_dead
-- Dead letters by queue (kept for a person to look at; few unless something is wrong).
SELECT queue_name, count(*)::bigint AS n FROM queue_dead GROUP BY queue_name;

-- name: outbox_lag
-- Wake-ups written but not yet published, and the age of the oldest: both off
-- outbox_pending_idx (the unsent rows alone).
SELECT (SELECT count(*) FROM outbox WHERE sent_at IS NULL)::bigint AS unsent,
       (SELECT extract(epoch FROM now() - created_at) FROM outbox
        WHERE sent_at IS NULL ORDER BY id LIMIT 1)::float8 AS oldest_seconds;

-- name: delivery_backlog
-- Deliveries not yet done (deliveries_due_idx holds these alone): how many, how old the oldest
-- is, and how far past its due time the most overdue one is.
SELECT status,
       count(*)::bigint AS n,
       extract(epoch FROM now() - min(created_at))::float8 AS oldest_seconds,
       greatest(0, extract(epoch FROM now() - min(next_attempt_at)))::float8 AS overdue_seconds
FROM deliveries
WHERE status IN ('pending', 'sending')
GROUP BY status;

-- name: sink_backlog
-- Buffered batches the sink has not loaded yet, by dataset (buffer_records_pending_idx holds
-- these alone, migration 0038), with the age of each dataset's oldest.
SELECT dataset_uuid::text AS dataset_uuid,
       count(*)::bigint AS n,
       extract(epoch FROM now() - min(created_at))::float8 AS oldest_seconds
FROM buffer_records
WHERE status = 'pending'
GROUP BY dataset_uuid;

-- name: worker_registry
-- The worker registry by state (ended workers are pruned a week after they end), and the slots
-- the live ones offer.
SELECT state, count(*)::bigint AS n, coalesce(sum(slots), 0)::bigint AS slots
FROM workers
GROUP BY state;
