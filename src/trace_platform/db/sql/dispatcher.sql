-- Named queries of the Dispatcher core (task lifecycle).

-- name: insert_tasks
-- Many intents in one statement (a run's jobs, an event's fan-out, a batch): the registry and
-- status rows of every task, from one JSON array (`n`: each row's place in it). The start days
-- come back in the array's order.
WITH x AS (
  SELECT *
  FROM jsonb_to_recordset(%(rows)s::jsonb) AS x(
    task_id uuid, org_id uuid, dag_id uuid, dag_version int, job text, operator text,
    runtime text, config jsonb, parent_task_id uuid, input_event_id uuid, input_event jsonb,
    input_versions jsonb, timeout_seconds int, max_attempts int,
    retry_backoff_seconds double precision, retry_backoff_max_seconds double precision,
    run_id uuid, worker_pool text, max_concurrency int, outputs jsonb, status text,
    whole_job text, n bigint)
), reg AS (
  INSERT INTO task_registry (
    task_id, start_day, org_id, dag_id, dag_version, job, operator, runtime, config,
    parent_task_id, input_event_id, input_event, input_versions, timeout_seconds, max_attempts,
    retry_backoff_seconds, retry_backoff_max_seconds, run_id, worker_pool, max_concurrency,
    outputs)
  SELECT task_id, trace_start_day(now()), org_id, dag_id, dag_version, job, operator, runtime,
         config, parent_task_id, input_event_id, input_event, input_versions, timeout_seconds,
         max_attempts, retry_backoff_seconds, retry_backoff_max_seconds, run_id, worker_pool,
         max_concurrency, outputs
  FROM x ORDER BY n
  RETURNING task_id, start_day
), st AS (
  -- A pooled task's status row carries its pool (see waiting_for_pool; NULL without one), a
  -- pooled whole writer's its job too (waiting_for_job).
  INSERT INTO task_status (task_id, start_day, status, pool_dag_id, worker_pool, whole_job)
  SELECT reg.task_id, reg.start_day, x.status,
         CASE WHEN x.worker_pool IS NOT NULL THEN x.dag_id END, x.worker_pool,
         CASE WHEN x.worker_pool IS NOT NULL THEN x.whole_job END
  FROM reg JOIN x USING (task_id) ORDER BY x.n
  RETURNING task_id, start_day
)
SELECT st.start_day FROM st JOIN x USING (task_id) ORDER BY x.n;

-- name: insert_outbox_many
-- Wake-ups in one statement, in the given order (the outbox's ids follow it). The payloads
-- travel as a binary text[]: as text, every quote in them is escaped, element by element, in
-- Python (20 us a wake-up, measured).
INSERT INTO outbox (queue_name, payload, delay_seconds)
SELECT w.queue_name, w.payload::jsonb, w.delay_seconds
FROM unnest(%(queues)s::text[], %(payloads)b::text[], %(delays)s::int[])
     WITH ORDINALITY AS w(queue_name, payload, delay_seconds, n)
ORDER BY w.n;

-- name: insert_outbox
INSERT INTO outbox (queue_name, payload, delay_seconds)
VALUES (%(queue)s, %(payload)s, %(delay)s);

-- name: insert_task_wakeup
-- A task's wake-up on the queue of its runtime (`queues`: runtime -> queue name, any other
-- runtime's on `queue`): a lambda task's only the Lambda invoker takes. Its registry row is read
-- by key, the status row (hash-partitioned by task_id) giving the start_day that prunes it.
INSERT INTO outbox (queue_name, payload, delay_seconds)
SELECT coalesce(%(queues)s::jsonb ->> r.runtime, %(queue)s), %(payload)s, %(delay)s
FROM task_status s
JOIN task_registry r ON r.task_id = s.task_id AND r.start_day = s.start_day
WHERE s.task_id = %(task_id)s;

-- name: finish_attempt
UPDATE task_attempts
SET finished_at = coalesce(finished_at, now()),
    outcome = %(outcome)s,
    error = coalesce(%(error)s, error)
WHERE task_id = %(task_id)s AND start_day = %(start_day)s AND attempt = %(attempt)s;

-- name: status_for_update
-- version_state: whether the DAG version that made the task was rolled back or abandoned since;
-- reprocessing: the task redoes a scope upstream invalidated (its own events invalidate too).
SELECT s.*, r.max_attempts, r.retry_backoff_seconds, r.retry_backoff_max_seconds, r.org_id,
       r.outputs, r.run_id, r.dag_id, r.dag_version, r.job, r.operator,
       coalesce((r.input_event ->> 'invalidates')::boolean, false) AS reprocessing,
       (SELECT v.state FROM dag_versions v
        WHERE v.dag_id = r.dag_id AND v.version = r.dag_version) AS version_state,
       -- withdrawn: its version was rolled back or abandoned and its job's lineage is not the
       -- live version's (a job both versions share keeps its work).
       EXISTS (SELECT 1 FROM dag_versions v
               WHERE v.dag_id = r.dag_id AND v.version = r.dag_version
                 AND v.state IN ('rolled_back', 'abandoned'))
       AND NOT EXISTS (SELECT 1 FROM dag_version_jobs j1
                       JOIN dags d ON d.dag_id = j1.dag_id
                       JOIN dag_version_jobs j2 ON j2.dag_id = j1.dag_id
                        AND j2.dag_version = d.active_version AND j2.job = j1.job
                       WHERE j1.dag_id = r.dag_id AND j1.dag_version = r.dag_version
                         AND j1.job = r.job AND j2.since_version = j1.since_version) AS withdrawn
FROM task_status s
JOIN task_registry r ON r.task_id = s.task_id AND r.start_day = s.start_day
WHERE s.task_id = %(task_id)s
FOR UPDATE OF s;

-- name: status
SELECT * FROM task_status WHERE task_id = %(task_id)s;

-- name: heartbeat_many
-- Extends the leases of a batch of running attempts (the Dispatcher's group commit: heartbeats
-- that arrive while one is being written go together; a lone one is a batch of one), in one
-- round trip: each row fenced by its own attempt and lease token (parallel arrays, one entry
-- per task, sent in task_id order so two batches lock in one order). A reported progress
-- replaces the last one (none reported keeps it). No row lock taken first and no indexed column
-- changed (not updated_at either: heartbeat_at says when it beat): a heap-only update
-- (migration 0040). Returns the rows extended; any other did not hold its lease (its caller
-- says why).
-- The arrays go in binary (`%(x)b`): as text, each JSON element is escaped for the array
-- literal, the larger part of the caller's CPU for a batch.
-- The status is matched through the batch (`b.status`, 'running' on every entry), never as a
-- condition of the scan alone: with `s.status = 'running'` there, a generic plan made while
-- running tasks looked rare read every running row off the live status index and kept the
-- batch's by filter (1,500 rows for a batch of 2 among 2,000 running tasks, every batch).
UPDATE task_status s
SET lease_until = now() + make_interval(secs => %(lease)s),
    heartbeat_at = now(),
    progress = coalesce(b.progress, s.progress),
    progress_at = CASE WHEN b.progress IS NULL THEN s.progress_at ELSE now() END
FROM unnest(%(task_ids)b::uuid[], %(attempts)b::bigint[], %(lease_tokens)b::uuid[],
            %(progress)b::jsonb[],
            array_fill('running'::text, ARRAY[cardinality(%(task_ids)b::uuid[])]))
       AS b(task_id, attempt, lease_token, progress, status)
WHERE s.task_id = ANY(%(task_ids)b::uuid[])
  AND s.task_id = b.task_id AND s.attempt = b.attempt AND s.lease_token = b.lease_token
  AND s.status = b.status
RETURNING s.task_id, s.status, s.lease_until, s.cancel_requested;

-- name: set_succeeded
UPDATE task_status
SET status = 'succeeded', lease_until = NULL, finished_at = now(), updated_at = now(),
    last_error = NULL
WHERE task_id = %(task_id)s;

-- name: set_terminal
-- failed or canceled; the lease token stays so a retried report can be recognised.
UPDATE task_status
SET status = %(status)s, lease_until = NULL, finished_at = now(), updated_at = now(),
    last_error = coalesce(%(error)s, last_error)
WHERE task_id = %(task_id)s;

-- name: set_retry
UPDATE task_status
SET status = 'queued', lease_until = NULL, updated_at = now(), last_error = %(error)s,
    next_attempt_at = now() + make_interval(secs => %(backoff)s)
WHERE task_id = %(task_id)s
RETURNING next_attempt_at;

-- name: insert_event
INSERT INTO events (event_id, start_day, org_id, producer_task_id, producer_attempt,
                    dataset_uuid, dedupe_key, cursor, partition_key, range_start, range_end, payload)
VALUES (%(event_id)s, %(start_day)s, %(org_id)s, %(task_id)s, %(attempt)s, %(dataset_uuid)s,
        %(dedupe_key)s, %(cursor)s, %(partition_key)s, %(range_start)s, %(range_end)s, %(payload)s)
ON CONFLICT (start_day, producer_task_id, dataset_uuid, dedupe_key) DO NOTHING
RETURNING event_id;

-- name: request_cancel
-- Cancels the queued/buffered tasks of the batch, flags the running ones (they stop
-- cooperatively); a finished (or missing) task is not returned. The ids come sorted, so two
-- batches lock their common rows in one order.
UPDATE task_status
SET cancel_requested = true,
    status = CASE WHEN status IN ('queued', 'buffered') THEN 'canceled' ELSE status END,
    finished_at = CASE WHEN status IN ('queued', 'buffered') THEN now() ELSE finished_at END,
    updated_at = now()
WHERE task_id = ANY(%(task_ids)s::uuid[]) AND status IN ('queued', 'buffered', 'running')
RETURNING task_id, status, cancel_requested;

-- name: expired_leases
-- Running attempts whose lease (missed heartbeats) or deadline (timeout_seconds) ran out,
-- the lapsed leases first. Read by key, whatever the statistics the plan was made from:
--  * the expired ids are picked first, in one read of the running rows off
--    task_status_running_idx (keyed by task_id, never changed: migration 0040), lease_until
--    and deadline_at filtered on the heap, in lease order. Neither is indexed: a heartbeat
--    changes lease_until, and an index on it made every heartbeat a non-HOT update. All the
--    expired ids, not `limit` of them: a row another reaper holds is skipped and the next one
--    taken, as before.
--  * each one's status row by its key alone (a LATERAL subquery with LIMIT 1, locked there
--    as the loop reaches it, in the ids' order: the LIMIT stops the loop), its conditions
--    checked outside on the locked row. With `status = 'running'` beside the key, a plan made
--    while running tasks looked rare scanned a whole partial index of running rows instead.
--  * its registry row by key (a LATERAL subquery with LIMIT 1, never flattened): as a join, a
--    plan made while the tables were empty (the first tick of a new install) hash-joined a
--    sequential scan of every task ever registered, on every tick.
-- `leases` false: the passed deadlines only (a reaper back from an outage gives the workers a
-- lease's time to beat again before it ends a lease that lapsed while no beat could land).
SELECT s.task_id, s.start_day, s.attempt, s.cancel_requested,
       (s.deadline_at < now()) AS timed_out,
       r.max_attempts, r.retry_backoff_seconds, r.retry_backoff_max_seconds
FROM unnest(ARRAY(
       SELECT e.task_id FROM task_status e
       WHERE e.status COLLATE "C" = 'running' AND e.task_id IS NOT NULL
         AND ((%(leases)s AND e.lease_until < now()) OR e.deadline_at < now())
       ORDER BY e.lease_until, e.task_id)) WITH ORDINALITY AS x(task_id, n)
CROSS JOIN LATERAL (
  SELECT k.task_id, k.start_day, k.status, k.attempt, k.cancel_requested, k.lease_until,
         k.deadline_at
  FROM task_status k
  WHERE k.task_id = x.task_id
  LIMIT 1
) s
CROSS JOIN LATERAL (
  SELECT k.max_attempts, k.retry_backoff_seconds, k.retry_backoff_max_seconds
  FROM task_registry k
  WHERE k.task_id = s.task_id AND k.start_day = s.start_day
  LIMIT 1
) r
WHERE s.status = 'running' AND ((%(leases)s AND s.lease_until < now()) OR s.deadline_at < now())
ORDER BY x.n
LIMIT %(limit)s
FOR UPDATE OF s SKIP LOCKED;

-- name: revoke_worker_leases
-- The running attempts of workers the registry declared dead (`worker_ids`), locked in task
-- order, their lease ended now and its token cleared, shaped as `expired_leases` rows (with the
-- holder): the reaper ends each as it ends a lapsed lease. Without its token the attempt is
-- fenced for good: a late heartbeat, event or completion from that worker lands nothing (a
-- merely lapsed lease keeps its token, so its own late report may still land).
WITH held AS (
  SELECT s.task_id FROM task_status s
  WHERE s.status = 'running' AND s.worker_id = ANY(%(worker_ids)s::text[])
  ORDER BY s.task_id
  FOR UPDATE
), revoked AS (
  UPDATE task_status s
  SET lease_until = now(), lease_token = NULL, updated_at = now()
  FROM held
  WHERE s.task_id = held.task_id
  RETURNING s.task_id, s.start_day, s.attempt, s.cancel_requested, s.worker_id
)
SELECT v.task_id, v.start_day, v.attempt, v.cancel_requested, false AS timed_out, v.worker_id,
       r.max_attempts, r.retry_backoff_seconds, r.retry_backoff_max_seconds
FROM revoked v
JOIN task_registry r ON r.task_id = v.task_id AND r.start_day = v.start_day
ORDER BY v.task_id;

-- name: task_view
SELECT r.task_id, r.start_day, r.org_id, r.dag_id, r.dag_version, r.job, r.operator, r.runtime,
       r.config, r.parent_task_id, r.input_event, r.input_versions, r.timeout_seconds,
       r.max_attempts, r.created_at, r.run_id, r.worker_pool, r.max_concurrency, r.outputs,
       s.status, s.attempt, s.cancel_requested, s.lease_token, s.lease_until, s.heartbeat_at,
       s.deadline_at, s.next_attempt_at, s.last_error, s.finished_at
FROM task_status s
JOIN task_registry r ON r.task_id = s.task_id AND r.start_day = s.start_day
-- The start_day again as an init plan: the registry is pruned to the task's month as the
-- statement starts (the join alone lets the planner probe every partition by task_id).
 AND r.start_day = (SELECT x.start_day FROM task_status x WHERE x.task_id = %(task_id)s)
WHERE s.task_id = %(task_id)s;

-- name: task_attempts
SELECT attempt, worker_id, started_at, finished_at, outcome, error
FROM task_attempts
WHERE task_id = %(task_id)s AND start_day = %(start_day)s
ORDER BY attempt;

-- name: task_event_count
SELECT count(*) AS n FROM events
WHERE producer_task_id = %(task_id)s AND start_day = %(start_day)s;

-- name: list_tasks
SELECT r.task_id, r.job, r.operator, r.created_at, s.status, s.attempt, s.last_error, s.finished_at
FROM task_status s
JOIN task_registry r ON r.task_id = s.task_id AND r.start_day = s.start_day
ORDER BY r.created_at DESC
LIMIT %(limit)s;

-- name: stranded_queued
-- Claimable tasks nobody touched for a long time: their wake-up may have been dead-lettered.
-- (A paused DAG's tasks are not claimable; resume wakes them.)
-- Oldest first, off task_status_queued_idx (the queued tasks by updated_at): it reads the
-- stale ones and stops at the first touched since. Through the live status index it read
-- every queued task (20,000 at a backlog of 20,000) on every tick, to find none. The status
-- is compared in collation "C", as that index's predicate is (see migration 0020): no other
-- status index serves this statement, whatever the statistics.
SELECT s.task_id, s.start_day
FROM task_status s
WHERE s.status COLLATE "C" = 'queued'
  AND NOT s.cancel_requested
  AND s.next_attempt_at <= now()
  AND s.updated_at < now() - make_interval(secs => %(after)s)
  AND NOT EXISTS (SELECT 1 FROM task_registry r JOIN dags d ON d.dag_id = r.dag_id
                  WHERE r.task_id = s.task_id AND r.start_day = s.start_day AND d.paused)
ORDER BY s.updated_at
LIMIT %(limit)s
FOR UPDATE OF s SKIP LOCKED;

-- name: touch
UPDATE task_status SET updated_at = now() WHERE task_id = ANY(%(ids)s);

-- name: task_pool
SELECT dag_id, worker_pool, max_concurrency, job, operator FROM task_registry
WHERE task_id = %(task_id)s;

-- name: lock_pool
SELECT pg_advisory_xact_lock(hashtext(%(dag_id)s::text || '/' || %(pool)s));

-- name: pool_usage
-- How many slots this job's running tasks hold, and the first free slot, if any. A pool's
-- slots retired by a deploy (it lists fewer, or not the pool) take no task while the pool has
-- a live slot; a pool the live version dropped altogether keeps serving, with its old slots,
-- the tasks made under it (else they would wait for a slot forever): `retired` must equal
-- bool_and(retired) over the pool, true only when every slot of it is retired.
-- job_running_in_dag: the slots whole-writer runs of the job hold in any pool of its DAG (a
-- whole writer runs one at a time across pools: a deploy can move it to another pool while a
-- run holds the old).
SELECT
  (SELECT count(*) FROM pool_slots
    WHERE dag_id = %(dag_id)s AND pool = %(pool)s AND leased_job = %(job)s) AS job_running,
  (SELECT count(*) FROM pool_slots
    WHERE dag_id = %(dag_id)s AND leased_job = %(job)s AND leased_whole) AS job_running_in_dag,
  (SELECT slot_index FROM pool_slots
    WHERE dag_id = %(dag_id)s AND pool = %(pool)s AND leased_by_task IS NULL
      AND retired = (SELECT bool_and(retired) FROM pool_slots
                     WHERE dag_id = %(dag_id)s AND pool = %(pool)s)
    ORDER BY slot_index LIMIT 1) AS free_slot;

-- name: lease_slot
UPDATE pool_slots
SET leased_by_task = %(task_id)s, leased_job = %(job)s, leased_at = now(),
    leased_whole = %(whole)s
WHERE dag_id = %(dag_id)s AND pool = %(pool)s AND slot_index = %(slot_index)s AND leased_by_task IS NULL;

-- name: release_slot
-- Returns who held it, as the row said before this update (a whole writer wakes its next run).
UPDATE pool_slots p
SET leased_by_task = NULL, leased_job = NULL, leased_at = NULL, leased_whole = false
FROM (SELECT dag_id, pool, slot_index, leased_job, leased_whole FROM pool_slots
      WHERE leased_by_task = %(task_id)s FOR UPDATE) held
WHERE p.dag_id = held.dag_id AND p.pool = held.pool AND p.slot_index = held.slot_index
RETURNING p.dag_id, p.pool, held.leased_job AS job, held.leased_whole AS whole;

-- name: waiting_for_pool
-- Queued tasks of a pool that can run now, oldest first, as many as the pool has free slots:
-- in each job only as many as its max_concurrency leaves room for (a job at its limit would
-- refuse the claim, and the wake-up would be spent while another job's task waited on).
-- The pool's queued tasks are read off task_status_pool_idx (a status row carries its pool),
-- each one's registry row then by key (a LATERAL subquery with LIMIT 1, its conditions
-- applied outside it; the registry stays what decides the pool). Driven by the registry's
-- pool index, it read every task the pool ever ran and each one's status (40,000 rows for a
-- history of 20,000, on every slot released); as a join of the two, a plan made from
-- statistics older than a burst of queued tasks scanned every queued task once per task of
-- the pool. `skip_job`: a whole writer whose run just freed a slot (its next run is chosen
-- among all its pools by waiting_for_job, so this pool's slots go to the other jobs); NULL.
WITH leased AS (
  SELECT leased_job AS job, count(*) AS n FROM pool_slots
  WHERE dag_id = %(dag_id)s AND pool = %(pool)s AND leased_by_task IS NOT NULL
  GROUP BY leased_job
),
waiting AS (
  -- Ties on updated_at (tasks queued in one statement) go oldest made first, as the memory
  -- store keeps them: the pool index returns equal keys in no particular order.
  SELECT s.task_id, s.updated_at, r.created_at,
         row_number() OVER (PARTITION BY r.job ORDER BY s.updated_at, r.created_at, s.task_id)
           AS place,
         -- A whole writer has room only while no whole run of its job holds a slot of any
         -- pool (a wake-up for one held elsewhere would be spent on a refused claim), and
         -- within its max_concurrency here, as any job.
         least(
           coalesce(r.max_concurrency, 1) - coalesce(l.n, 0),
           CASE WHEN s.whole_job IS NOT NULL
                THEN 1 - (SELECT count(*) FROM pool_slots h
                          WHERE h.dag_id = %(dag_id)s AND h.leased_job = s.whole_job
                            AND h.leased_whole) END) AS room
  FROM task_status s
  CROSS JOIN LATERAL (
    SELECT k.dag_id, k.worker_pool, k.job, k.max_concurrency, k.created_at
    FROM task_registry k
    WHERE k.task_id = s.task_id AND k.start_day = s.start_day
    LIMIT 1
  ) r
  LEFT JOIN leased l ON l.job = r.job
  -- status in collation "C", as task_status_pool_idx's predicate (migration 0021).
  WHERE s.pool_dag_id = %(dag_id)s AND s.worker_pool = %(pool)s
    AND s.status COLLATE "C" = 'queued' AND NOT s.cancel_requested AND s.next_attempt_at <= now()
    AND (%(skip_job)s::text IS NULL OR s.whole_job IS DISTINCT FROM %(skip_job)s)
    AND r.dag_id = %(dag_id)s AND r.worker_pool = %(pool)s
    AND NOT EXISTS (SELECT 1 FROM dags d WHERE d.dag_id = r.dag_id AND d.paused)
)
SELECT task_id FROM waiting
WHERE place <= room
ORDER BY updated_at, created_at, task_id
-- The free slots a claim may take, as pool_usage counts them (a dropped pool's retired ones).
LIMIT (SELECT count(*) FROM pool_slots
       WHERE dag_id = %(dag_id)s AND pool = %(pool)s AND leased_by_task IS NULL
         AND retired = (SELECT bool_and(retired) FROM pool_slots
                        WHERE dag_id = %(dag_id)s AND pool = %(pool)s));

-- name: waiting_for_job
-- The next run of a whole writer, to wake when its running task frees its slot (or a queued
-- run is canceled): the oldest queued one that can claim now, in any pool of its DAG (a deploy
-- may have moved the job while it had runs queued). One run, never one per pool, for only one
-- can run; none while a whole run of the job holds a slot. A run whose pool is full is left
-- to that pool's next release. Off task_status_whole_idx (migration 0023): the job's queued
-- runs only, however many other tasks the DAG has queued.
SELECT s.task_id
FROM task_status s
CROSS JOIN LATERAL (
  SELECT k.created_at, k.max_concurrency
  FROM task_registry k
  WHERE k.task_id = s.task_id AND k.start_day = s.start_day
  LIMIT 1
) r
WHERE s.pool_dag_id = %(dag_id)s AND s.whole_job = %(job)s
  AND s.status COLLATE "C" = 'queued' AND NOT s.cancel_requested AND s.next_attempt_at <= now()
  AND NOT EXISTS (SELECT 1 FROM dags d WHERE d.dag_id = %(dag_id)s AND d.paused)
  AND NOT EXISTS (SELECT 1 FROM pool_slots h
                  WHERE h.dag_id = %(dag_id)s AND h.leased_job = %(job)s AND h.leased_whole)
  -- A free slot a claim may take (as pool_usage), within the job's max_concurrency there.
  AND EXISTS (SELECT 1 FROM pool_slots f
              WHERE f.dag_id = %(dag_id)s AND f.pool = s.worker_pool AND f.leased_by_task IS NULL
                AND f.retired = (SELECT bool_and(retired) FROM pool_slots
                                 WHERE dag_id = %(dag_id)s AND pool = s.worker_pool))
  AND (SELECT count(*) FROM pool_slots j
       WHERE j.dag_id = %(dag_id)s AND j.pool = s.worker_pool AND j.leased_job = %(job)s)
      < coalesce(r.max_concurrency, 1)
ORDER BY s.updated_at, r.created_at, s.task_id
LIMIT 1;

-- name: slot_of_task
SELECT pool, slot_index, env, secrets FROM pool_slots WHERE leased_by_task = %(task_id)s;

-- name: slot_secret_values
-- The secrets a task's slot names, sealed, with who may use them (org_id NULL: not set).
SELECT e.key AS env_var, e.value AS name, s.org_id, s.owner_user_id, s.use_roles,
       s.ciphertext, s.legacy_value IS NOT NULL AS legacy
FROM pool_slots ps
CROSS JOIN LATERAL jsonb_each_text(ps.secrets) AS e(key, value)
LEFT JOIN secrets s ON s.org_id = %(org_id)s AND s.name = e.value
WHERE ps.leased_by_task = %(task_id)s
ORDER BY e.key;

-- name: task_deployer
-- The user who deployed the task's DAG version, with their roles as they are now.
SELECT u.user_id, u.org_id, u.name, u.is_admin, u.roles
FROM task_registry r
JOIN dag_versions v ON v.dag_id = r.dag_id AND v.version = r.dag_version
JOIN users u ON u.user_id = v.deployed_by
WHERE r.task_id = %(task_id)s AND r.start_day = %(start_day)s;

-- name: insert_commit
-- A scope's commit swaps its location atomically; the location it replaces (a retry's or a
-- replay's predecessor: files are never rewritten in place) is retired in the same statement,
-- for the collector (registry/collector.py). FOR UPDATE: a concurrent commit of the scope is
-- waited for and its location is the one retired. (Two concurrent FIRST commits of a scope can
-- leave the loser's files unretired: garbage kept, never a committed file deleted.)
WITH old AS (
  SELECT location FROM dataset_commits
  WHERE dataset_version = %(dataset_version)s AND scope = %(scope)s
  FOR UPDATE
), up AS (
  INSERT INTO dataset_commits (commit_id, dataset_uuid, dataset_version, task_id, attempt, scope,
                               partition_key, range_start, range_end, location, row_count,
                               byte_count, dag_version, chain_id, first_block_hash,
                               last_block_hash, parent_hash)
  VALUES (%(commit_id)s, %(dataset_uuid)s, %(dataset_version)s, %(task_id)s, %(attempt)s, %(scope)s,
          %(partition_key)s, %(range_start)s, %(range_end)s, %(location)s, %(row_count)s,
          %(byte_count)s, %(dag_version)s, %(chain_id)s, %(first_block_hash)s,
          %(last_block_hash)s, %(parent_hash)s)
  ON CONFLICT (dataset_version, scope) DO UPDATE
  SET task_id = EXCLUDED.task_id, attempt = EXCLUDED.attempt, location = EXCLUDED.location,
      dag_version = EXCLUDED.dag_version,
      row_count = EXCLUDED.row_count, byte_count = EXCLUDED.byte_count, created_at = now(),
      chain_id = EXCLUDED.chain_id, first_block_hash = EXCLUDED.first_block_hash,
      last_block_hash = EXCLUDED.last_block_hash, parent_hash = EXCLUDED.parent_hash
  RETURNING location
)
INSERT INTO retired_locations (org_id, backend, location, reason)
SELECT ds.org_id, coalesce(v.backend, ds.backend), old.location, 'superseded'
FROM old CROSS JOIN up JOIN datasets ds ON ds.dataset_uuid = %(dataset_uuid)s
LEFT JOIN dataset_versions v ON v.dataset_version = %(dataset_version)s
WHERE old.location IS NOT NULL AND old.location IS DISTINCT FROM up.location
-- A row back: the scope was rewritten (its dataset's strategy says whether that invalidates).
RETURNING (SELECT coalesce(v.update_strategy, d.update_strategy)
           FROM dataset_versions v JOIN datasets d USING (dataset_uuid)
           WHERE v.dataset_version = %(dataset_version)s) AS update_strategy;

-- name: claim
-- Lease a claimable task and open its attempt, in one round trip. `pooled` false claims only
-- tasks without a worker pool (the caller then leases a slot in the same transaction).
WITH c AS (
  UPDATE task_status s
  SET status = 'running',
      attempt = s.attempt + 1,
      -- The worker's claim key when it sent one (see ClaimRequest.claim_id).
      lease_token = coalesce(%(lease_token)s::uuid, gen_random_uuid()),
      lease_until = now() + make_interval(secs => %(lease)s),
      heartbeat_at = now(),
      started_at = now(),
      deadline_at = now() + make_interval(secs => r.timeout_seconds),
      worker_id = %(worker_id)s,
      finished_at = NULL,
      updated_at = now(),
      progress = NULL,
      progress_at = NULL
  FROM task_registry r
  WHERE s.task_id = %(task_id)s
    AND r.task_id = s.task_id AND r.start_day = s.start_day
    AND (r.worker_pool IS NULL) <> %(pooled)s
    AND s.status = 'queued'
    AND s.next_attempt_at <= now()
    AND NOT s.cancel_requested
    -- a paused DAG's tasks wait (resume wakes them)
    AND NOT EXISTS (SELECT 1 FROM dags d WHERE d.dag_id = r.dag_id AND d.paused)
  RETURNING s.task_id, s.start_day, s.attempt, s.lease_token, s.lease_until
), a AS (
  INSERT INTO task_attempts (task_id, start_day, attempt, lease_token, worker_id)
  SELECT task_id, start_day, attempt, lease_token, %(worker_id)s FROM c
)
SELECT * FROM c;

-- name: complete_fast
-- A plain success (no events, outputs or slot) of the current attempt, in one round trip.
-- Zero rows means "not that simple": the full path decides, and explains any refusal.
WITH st AS (
  SELECT task_id, start_day
  FROM task_status
  WHERE task_id = %(task_id)s AND attempt = %(attempt)s AND lease_token = %(lease_token)s
    AND status IN ('running', 'queued', 'failed')
    AND NOT EXISTS (SELECT 1 FROM pool_slots WHERE leased_by_task = %(task_id)s)
  FOR UPDATE
), upd AS (
  -- A scalar sub-select (not a join with st): a plan made while the table looked small
  -- hash-joined st against a sequential scan of every task.
  UPDATE task_status s
  SET status = 'succeeded', lease_until = NULL, finished_at = now(), updated_at = now(),
      last_error = NULL
  WHERE s.task_id = (SELECT task_id FROM st)
  RETURNING s.task_id, s.start_day
), att AS (
  -- Scalar sub-selects (not a join) so the partition and the row are found by index.
  UPDATE task_attempts a
  SET finished_at = coalesce(a.finished_at, now()), outcome = 'succeeded'
  WHERE a.start_day = (SELECT start_day FROM upd)
    AND a.task_id = (SELECT task_id FROM upd)
    AND a.attempt = %(attempt)s
)
SELECT task_id FROM upd;

-- name: claim_many
-- Lease every plain claimable task among a batch of wake-ups in one round trip: no worker
-- pool (a slot is leased task by task) and no input another DAG produces (its read access is
-- checked task by task). Rows locked elsewhere are skipped, not waited for (no lock-order
-- deadlock between batches); the caller takes every id not returned the one-task way, which
-- also names why it is not claimable. Returns task_view's columns, the new lease included.
-- `task_ids` and `worker_ids` are parallel arrays: who claims each task. Its SET list is the
-- one-task `claim`'s (kept apart: that one is cheaper to plan for a lone task); the store
-- conformance test `a_batch_claim_leaves_what_a_one_task_claim_leaves` holds them together.
-- Each requested task is read by key in a LATERAL subquery with LIMIT 1 (planned on its own,
-- never flattened into the join): as a plain join, a plan made from statistics older than a
-- burst of new tasks (a generic plan, or autovacuum not yet run) read every queued task
-- through the status index and kept the requested ones: 5.5 ms for a claim of 5 among
-- 20,000 queued tasks, against 1.6 ms by key. Every other table is reached by key too: the
-- registry by scalar sub-selects and a LATERAL subquery, the rows to update through
-- `= ANY(ARRAY(...))` of the ids (a join with the requests was hash-joined with a scan of
-- every task by a plan made while the tables held a handful of rows).
WITH req AS (
  SELECT * FROM unnest(%(task_ids)s::uuid[], %(worker_ids)s::text[], %(lease_tokens)s::uuid[])
    AS q(task_id, worker_id, lease_token)
), cand AS (
  SELECT s.task_id, s.start_day, s.timeout_seconds, q.worker_id, q.lease_token
  FROM req q
  -- Each requested task by key (see above).
  CROSS JOIN LATERAL (
    SELECT k.task_id, k.start_day,
           (SELECT r.timeout_seconds FROM task_registry r
            WHERE r.task_id = k.task_id AND r.start_day = k.start_day) AS timeout_seconds
    FROM task_status k
    WHERE k.task_id = q.task_id
      AND k.status = 'queued'
      AND k.next_attempt_at <= now()
      AND NOT k.cancel_requested
      -- The registry's conditions too (a scalar sub-select: a SubPlan by key, never a join),
      -- so a row the batch does not claim is never locked.
      AND coalesce((
        SELECT r.worker_pool IS NULL
           AND NOT EXISTS (SELECT 1 FROM dags d WHERE d.dag_id = r.dag_id AND d.paused)
           AND NOT EXISTS (
             SELECT 1
             FROM jsonb_array_elements(r.input_versions) AS i(ref)
             JOIN datasets ds ON ds.dataset_uuid = (i.ref ->> 'dataset_uuid')::uuid
             JOIN dags p ON p.dag_id = ds.producer_dag_id
             WHERE ds.producer_dag_id IS DISTINCT FROM r.dag_id
           )
        FROM task_registry r
        WHERE r.task_id = k.task_id AND r.start_day = k.start_day
      ), false)
    LIMIT 1
  ) s
  -- Each row is locked inside its LATERAL lookup, as the loop reaches it; SKIP LOCKED never
  -- waits, so the order cannot deadlock.
  FOR UPDATE OF s SKIP LOCKED
), c AS (
  UPDATE task_status s
  SET status = 'running',
      attempt = s.attempt + 1,
      lease_token = coalesce(cand.lease_token, gen_random_uuid()),
      lease_until = now() + make_interval(secs => %(lease)s),
      heartbeat_at = now(),
      started_at = now(),
      deadline_at = now() + make_interval(secs => cand.timeout_seconds),
      worker_id = cand.worker_id,
      finished_at = NULL,
      updated_at = now(),
      progress = NULL,
      progress_at = NULL
  FROM cand
  WHERE s.task_id = ANY(ARRAY(SELECT task_id FROM cand))
    AND s.task_id = cand.task_id AND s.start_day = cand.start_day
  RETURNING s.task_id, s.start_day, s.status, s.attempt, s.cancel_requested, s.lease_token,
            s.lease_until, s.heartbeat_at, s.deadline_at, s.next_attempt_at, s.last_error,
            s.finished_at, s.worker_id
), a AS (
  INSERT INTO task_attempts (task_id, start_day, attempt, lease_token, worker_id)
  SELECT task_id, start_day, attempt, lease_token, worker_id FROM c
)
SELECT r.task_id, r.start_day, r.org_id, r.dag_id, r.dag_version, r.job, r.operator, r.runtime,
       r.config, r.parent_task_id, r.input_event, r.input_versions, r.timeout_seconds,
       r.max_attempts, r.created_at, r.run_id, r.worker_pool, r.max_concurrency, r.outputs,
       c.status, c.attempt, c.cancel_requested, c.lease_token, c.lease_until, c.heartbeat_at,
       c.deadline_at, c.next_attempt_at, c.last_error, c.finished_at
FROM c
CROSS JOIN LATERAL (
  SELECT * FROM task_registry k WHERE k.task_id = c.task_id AND k.start_day = c.start_day LIMIT 1
) r;

-- name: complete_fast_many
-- complete_fast for a batch, in one round trip: each row is fenced by its own attempt and
-- lease token (the arrays are parallel). Rows are locked in task_id order (no deadlock with
-- another batch); the ids returned succeeded, every other one takes the full path.
WITH req AS (
  SELECT * FROM unnest(%(task_ids)s::uuid[], %(attempts)s::bigint[], %(lease_tokens)s::uuid[])
    AS q(task_id, attempt, lease_token)
), st AS (
  SELECT s.task_id, s.start_day, s.attempt
  -- In task_id order: each row is locked as the nested loop reaches it (a LockRows under
  -- the LATERAL's LIMIT), so the requests' order is the lock order.
  FROM (SELECT * FROM req ORDER BY task_id) q
  -- Each requested task by key (see claim_many).
  CROSS JOIN LATERAL (
    SELECT k.task_id, k.start_day, k.attempt
    FROM task_status k
    WHERE k.task_id = q.task_id AND k.attempt = q.attempt AND k.lease_token = q.lease_token
      AND k.status IN ('running', 'queued', 'failed')
    LIMIT 1
  ) s
  WHERE NOT EXISTS (SELECT 1 FROM pool_slots p WHERE p.leased_by_task = s.task_id)
  ORDER BY s.task_id
  FOR UPDATE OF s
), upd AS (
  -- The rows by key, through `= ANY(ARRAY(...))` of the locked ids (see claim_many).
  UPDATE task_status s
  SET status = 'succeeded', lease_until = NULL, finished_at = now(), updated_at = now(),
      last_error = NULL
  FROM st
  WHERE s.task_id = ANY(ARRAY(SELECT task_id FROM st))
    AND s.task_id = st.task_id AND s.start_day = st.start_day
  RETURNING s.task_id, s.start_day, s.attempt
), att AS (
  UPDATE task_attempts a
  SET finished_at = coalesce(a.finished_at, now()), outcome = 'succeeded'
  FROM upd
  WHERE a.start_day = upd.start_day AND a.task_id = upd.task_id AND a.attempt = upd.attempt
)
SELECT task_id FROM upd;

-- name: operator_state
-- A job's state belongs to its lineage (the DAG version whose deploy cut its outputs): a
-- rebuild starts from none while the live version keeps its own.
SELECT state, revision FROM operator_state
WHERE org_id = %(org_id)s AND dag_id = %(dag_id)s AND job = %(job)s
  AND lineage = coalesce((SELECT since_version FROM dag_version_jobs
                          WHERE dag_id = %(dag_id)s AND dag_version = %(dag_version)s
                            AND job = %(job)s), 0);

-- name: lock_operator_state
-- Serializes state saves of one job: a row lock cannot cover the first save, when there is no
-- row yet. Read the revision in a later statement (READ COMMITTED: a fresh snapshot).
SELECT pg_advisory_xact_lock(hashtextextended(%(org_id)s::text || %(dag_id)s::text || %(job)s, 0));

-- name: save_operator_state
INSERT INTO operator_state (org_id, dag_id, job, lineage, state, updated_by_task)
VALUES (%(org_id)s, %(dag_id)s, %(job)s,
        coalesce((SELECT since_version FROM dag_version_jobs
                  WHERE dag_id = %(dag_id)s AND dag_version = %(dag_version)s
                    AND job = %(job)s), 0),
        %(state)s, %(task_id)s)
ON CONFLICT (org_id, dag_id, job, lineage)
DO UPDATE SET state = EXCLUDED.state, updated_by_task = EXCLUDED.updated_by_task, updated_at = now(),
              revision = operator_state.revision + 1;

-- name: untried_attempts
-- Attempts that are not tries (they do not count against max_attempts): lost to a concurrent
-- state save, or handed back by a worker shutting down; and every attempt up to the task's
-- latest retry by hand (task_retries: its run retried, a fresh budget of tries from there).
SELECT r.after + (SELECT count(*) FROM task_attempts
                  WHERE task_id = %(task_id)s AND start_day = %(start_day)s
                    AND attempt > r.after
                    AND outcome IN ('state_conflict', 'released')) AS n
FROM (SELECT coalesce(max(after_attempt), 0) AS after FROM task_retries
      WHERE task_id = %(task_id)s AND start_day = %(start_day)s) AS r;

-- name: retry_failed
-- A run's retry by hand: each task of the run (of the DAG version it fired, started between its
-- fire day and today, so only those days' partitions are read) that ended failed, queued again
-- now. Not one whose cancel was asked: queued, no claim would take it and nothing would end it.
-- Locked in task_id order (two retries of one run at once never deadlock). The lease token is
-- cleared, so no report of an attempt from before the retry lands (fencing's wrong_lease), even
-- before the next claim (attempt N+1). Each is noted in task_retries: its tries count afresh.
WITH failed AS (
  SELECT s.task_id, s.start_day, r.job, r.runtime
  FROM task_registry r
  JOIN task_status s ON s.task_id = r.task_id AND s.start_day = r.start_day
  WHERE r.run_id = %(run_id)s AND r.start_day BETWEEN %(first_day)s AND %(last_day)s
    AND r.dag_id = %(dag_id)s AND r.dag_version = %(dag_version)s
    AND s.status = 'failed' AND NOT s.cancel_requested
  ORDER BY s.task_id
  FOR UPDATE OF s
), retried AS (
  UPDATE task_status s
  SET status = 'queued', lease_token = NULL, lease_until = NULL, finished_at = NULL,
      next_attempt_at = now(), updated_at = now()
  FROM failed f
  WHERE s.task_id = f.task_id
  RETURNING s.task_id, s.start_day, s.attempt, f.job, f.runtime
), noted AS (
  INSERT INTO task_retries (task_id, start_day, after_attempt, run_id, retried_by)
  SELECT task_id, start_day, attempt, %(run_id)s, %(retried_by)s FROM retried
  ON CONFLICT DO NOTHING
)
SELECT task_id, start_day, attempt, job, runtime FROM retried ORDER BY task_id;

-- name: task_dag_paused
SELECT d.name, d.paused FROM task_registry r JOIN dags d ON d.dag_id = r.dag_id
WHERE r.task_id = %(task_id)s;

-- name: lock_dag_shared
-- The DAG's change lock, shared (as dag_tasks.sql's, which a cutover takes exclusive).
SELECT pg_advisory_xact_lock_shared(hashtextextended('trace-dag:' || %(dag_id)s::text, 0));

-- name: lock_task_dag_shared
-- A report that may fan out takes its DAG's change lock shared BEFORE its status row: the
-- order a cutover or rollback (change lock exclusive, then task rows) takes them too.
SELECT pg_advisory_xact_lock_shared(hashtextextended('trace-dag:' || dag_id::text, 0))
FROM task_registry WHERE task_id = %(task_id)s AND dag_id IS NOT NULL;

-- name: existing_versions
-- The output versions a completion commits to that still exist, held against a purge.
SELECT dataset_version FROM dataset_versions WHERE dataset_version = ANY(%(versions)s)
FOR KEY SHARE;

-- name: foreign_inputs
-- The task's inputs another DAG produces, with what decides who may read them now: the
-- dataset's read_roles, its producer DAG's owner and deploy_roles.
SELECT ds.dataset_name, ds.org_id, ds.read_roles, p.owner_user_id, p.deploy_roles
FROM task_registry r
CROSS JOIN LATERAL jsonb_array_elements(r.input_versions) AS i(ref)
JOIN datasets ds ON ds.dataset_uuid = (i.ref ->> 'dataset_uuid')::uuid
JOIN dags p ON p.dag_id = ds.producer_dag_id
WHERE r.task_id = %(task_id)s AND ds.producer_dag_id IS DISTINCT FROM r.dag_id
ORDER BY ds.dataset_name;

-- name: task_deployer_any_day
-- task_deployer, for a caller that does not know the task's start_day.
SELECT u.user_id, u.org_id, u.name, u.is_admin, u.roles, r.dag_version, d.name AS dag
FROM task_registry r
JOIN dags d ON d.dag_id = r.dag_id
JOIN dag_versions v ON v.dag_id = r.dag_id AND v.version = r.dag_version
JOIN users u ON u.user_id = v.deployed_by
WHERE r.task_id = %(task_id)s;

-- name: fail_unstarted
-- A queued (or buffered) task that may not run ends failed before any attempt, saying why.
UPDATE task_status
SET status = 'failed', last_error = %(error)s, finished_at = now(), updated_at = now()
WHERE task_id = %(task_id)s AND status IN ('queued', 'buffered')
RETURNING task_id;
