-- Named queries of retention by partition (src/trace_platform/retention). Queries with {name}
-- placeholders take identifiers composed with psycopg.sql (a partition's name is data).

-- name: partitions
-- Every partition of every table range-partitioned by start_day, with its bound as Postgres
-- prints it (FOR VALUES FROM ('31') TO ('59')) and whether a DETACH ... CONCURRENTLY was left
-- half done (it must be finalized).
SELECT p.relname AS parent, c.relname, pg_get_expr(c.relpartbound, c.oid) AS bound,
       i.inhdetachpending AS detach_pending
FROM pg_partitioned_table pt
JOIN pg_class p ON p.oid = pt.partrelid
JOIN pg_attribute a ON a.attrelid = pt.partrelid AND a.attnum = pt.partattrs[0]
JOIN pg_inherits i ON i.inhparent = p.oid
JOIN pg_class c ON c.oid = i.inhrelid
WHERE pt.partstrat = 'r' AND pt.partnatts = 1 AND a.attname = 'start_day'
  AND p.relnamespace = current_schema()::regnamespace AND NOT p.relispartition
ORDER BY p.relname, c.relname;

-- name: columns
-- A table's columns in order, with their types (format_type: 'uuid', 'text[]', ...).
SELECT a.attname AS name, format_type(a.atttypid, a.atttypmod) AS type
FROM pg_attribute a
WHERE a.attrelid = to_regclass(%(table)s) AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum;

-- name: primary_key
-- The columns of a table's primary key, in key order (a partition's are its parent's).
SELECT a.attname AS name, format_type(a.atttypid, a.atttypmod) AS type
FROM pg_index x
CROSS JOIN LATERAL unnest(x.indkey) WITH ORDINALITY AS k(attnum, n)
JOIN pg_attribute a ON a.attrelid = x.indrelid AND a.attnum = k.attnum
WHERE x.indrelid = to_regclass(%(table)s) AND x.indisprimary
ORDER BY k.n;

-- name: live_tasks
-- Tasks of these start days not finished yet (off the status index: live rows are few).
SELECT count(*) AS n FROM task_status
WHERE status IN ('queued', 'running', 'buffered')
  AND start_day >= %(lo)s AND start_day < %(hi)s;

-- name: building_dags
-- A rebuild replays the events Postgres holds: none may be in flight while history leaves.
SELECT name FROM dags WHERE building_version IS NOT NULL ORDER BY name;

-- name: export_of
SELECT * FROM retention_exports WHERE relname = %(relname)s;

-- name: record_export
-- A unit's export, once its files read back (exported_at: the snapshot it read); a re-export (the table changed before the drop)
-- replaces the record and its files.
INSERT INTO retention_exports (relname, parent, lo_day, hi_day, export_id, prefix, row_count,
                               key_checksum, row_checksum, exported_at)
VALUES (%(relname)s, %(parent)s, %(lo)s, %(hi)s, %(export_id)s, %(prefix)s, %(row_count)s,
        %(key_checksum)s, %(row_checksum)s, %(exported_at)s)
ON CONFLICT (relname) DO UPDATE
SET export_id = excluded.export_id, prefix = excluded.prefix, row_count = excluded.row_count,
    key_checksum = excluded.key_checksum, row_checksum = excluded.row_checksum,
    exported_at = excluded.exported_at;

-- name: forget_files
DELETE FROM retention_export_files WHERE relname = %(relname)s;

-- name: record_file
INSERT INTO retention_export_files (relname, key, org_id, row_count, bytes, sha256)
VALUES (%(relname)s, %(key)s, %(org_id)s, %(row_count)s, %(bytes)s, %(sha256)s);

-- name: files_of
SELECT key, org_id, row_count, bytes, sha256 FROM retention_export_files
WHERE relname = %(relname)s ORDER BY key;

-- name: mark_dropped
UPDATE retention_exports SET dropped_at = now() WHERE relname = %(relname)s AND dropped_at IS NULL;

-- name: orgs_and_role
-- Every org (each one's admins read in their audit log that a month of history went), and
-- the database role running retention (the operator's credential is the DSN).
SELECT o.org_id, current_user AS db_role FROM orgs o ORDER BY o.org_id;

-- name: exports
SELECT x.*, (SELECT count(*) FROM retention_export_files f WHERE f.relname = x.relname) AS files
FROM retention_exports x ORDER BY x.lo_day, x.parent;

-- name: history_files
-- The files of one history dataset an org may read: its own rows of every export of `parent`.
SELECT f.key, x.export_id
FROM retention_export_files f JOIN retention_exports x ON x.relname = f.relname
WHERE x.parent = %(parent)s AND f.org_id = %(org_id)s AND f.row_count > 0
ORDER BY x.lo_day, f.key;

-- name: history_parents
-- The history datasets with rows of this org.
SELECT DISTINCT x.parent
FROM retention_export_files f JOIN retention_exports x ON x.relname = f.relname
WHERE f.org_id = %(org_id)s AND f.row_count > 0
ORDER BY x.parent;

-- name: dropped_registry_at
-- The exported, dropped month of task_registry holding start day `day`, if any.
SELECT relname, prefix, lo_day, hi_day, dropped_at FROM retention_exports
WHERE parent = 'task_registry' AND lo_day <= %(day)s AND %(day)s < hi_day
  AND dropped_at IS NOT NULL;

-- name: dropped_registry_until
-- The first start day not exported of the task registry's dropped history (NULL: none).
SELECT max(hi_day) AS hi_day FROM retention_exports
WHERE parent = 'task_registry' AND dropped_at IS NOT NULL;

-- name: count_and_checksum
-- Rows and the checksum of their keys ({key}: the key columns as text joined by '|'), the
-- same sum retention/export.py computes over the Parquet read back; `at`: the snapshot's time.
-- row_checksum: over whole rows (their text, in the caller's UTC session), so a row updated in
-- place since the export (no key changed) is seen before a drop.
SELECT count(*) AS n, now() AS at,
       coalesce(sum(('x' || left(md5({key}), 15))::bit(60)::bigint), 0) AS checksum,
       coalesce(sum(hashtextextended(t::text, 0)), 0) AS row_checksum
FROM {table} t {where};

-- name: detach
ALTER TABLE {parent} DETACH PARTITION {part} CONCURRENTLY;

-- name: detach_finalize
ALTER TABLE {parent} DETACH PARTITION {part} FINALIZE;

-- name: drop_table
DROP TABLE {part};

-- name: delete_status
-- A batch of one exported month's task_status rows: finished, and unchanged since their export.
DELETE FROM task_status
WHERE task_id = ANY(%(ids)s::uuid[]) AND start_day >= %(lo)s AND start_day < %(hi)s
  AND status IN ('succeeded', 'failed', 'canceled') AND updated_at <= %(exported_at)s;

-- name: try_lock
-- One retention run at a time (a session lock: the run spans many transactions).
SELECT pg_try_advisory_lock(hashtext('trace_retention')) AS locked;

-- name: unlock
SELECT pg_advisory_unlock(hashtext('trace_retention'));

-- name: hold_off
-- A retry by hand of a run older than this month (control/service.py retry_run) queues again
-- tasks of a month retention may be taking: it holds retention off to the end of its
-- transaction (shared, so retries do not wait for one another), or is refused (false) while
-- a retention run holds the lock.
SELECT pg_try_advisory_xact_lock_shared(hashtext('trace_retention')) AS free;

-- name: finished_status_ids
-- A batch of a month's finished task_status rows unchanged since `before` (an unexported drop).
SELECT task_id FROM task_status
WHERE start_day >= %(lo)s AND start_day < %(hi)s
  AND status IN ('succeeded', 'failed', 'canceled') AND updated_at <= %(before)s
LIMIT %(limit)s;

-- name: fence_failed
-- A month's failed tasks refuse any late report from now on: a worker whose attempt the reaper
-- ended may still report success (complete_fast takes a failed task's current lease), which
-- would change rows already exported. Cleared lease tokens answer it wrong_lease instead.
UPDATE task_status SET lease_token = NULL
WHERE status = 'failed' AND lease_token IS NOT NULL
  AND start_day >= %(lo)s AND start_day < %(hi)s;
