-- The worker registry (migration 0034, dispatcher/fleet.py): registrations, beats, clean
-- stops, the reaper's verdicts and `trace workers list`.

-- name: register
-- A worker's registration; sent again (its answer lost, or the API restarted) it only beats.
-- Nothing for an id that is not this worker's alive row (stopped, declared dead, or another
-- host or pid under the same id): the caller says which.
INSERT INTO workers (worker_id, host, pid, version, slots, beat_seconds)
VALUES (%(worker_id)s, %(host)s, %(pid)s, %(version)s, %(slots)s, %(beat_seconds)s)
ON CONFLICT (worker_id) DO UPDATE
  SET last_beat = now(), version = EXCLUDED.version, slots = EXCLUDED.slots,
      beat_seconds = EXCLUDED.beat_seconds
  WHERE workers.state = 'alive' AND workers.host = EXCLUDED.host AND workers.pid = EXCLUDED.pid
RETURNING worker_id, state, beat_seconds;

-- name: beat
-- Only an alive worker beats: one declared dead stays dead (its attempts were ended).
UPDATE workers SET last_beat = now()
WHERE worker_id = %(worker_id)s AND state = 'alive'
RETURNING worker_id, state, beat_seconds;

-- name: stop
UPDATE workers SET state = 'stopped', ended_at = now(), ended_reason = 'stopped by its worker'
WHERE worker_id = %(worker_id)s AND state = 'alive'
RETURNING worker_id, state, beat_seconds;

-- name: worker
SELECT worker_id, host, pid, state, beat_seconds, ended_reason FROM workers
WHERE worker_id = %(worker_id)s;

-- name: mark_dead
-- Alive workers whose last beat is older than `beats` of their own intervals, declared dead
-- (a worker another reaper is declaring, or that is beating right now, is skipped: it is the
-- other's, or alive). The rows say why. Only a worker silent for `beats` intervals while the
-- reaper itself was watching (`watched` seconds: since it started, or since the registry could
-- last not be reached): a worker's beats cannot land while the API or the database is away, so
-- a silence the reaper did not see is no worker's fault.
UPDATE workers w
SET state = 'dead', ended_at = now(),
    ended_reason = format('no beat for %%s s (declared dead after %%s beats of %%s s)',
                          round(extract(epoch FROM now() - w.last_beat)::numeric, 1),
                          %(beats)s::int, w.beat_seconds)
FROM (
  SELECT worker_id FROM workers
  WHERE state = 'alive' AND last_beat < now() - make_interval(secs => %(beats)s * beat_seconds)
    AND %(watched)s::float8 >= %(beats)s * beat_seconds
  ORDER BY worker_id
  FOR UPDATE SKIP LOCKED
) x
WHERE w.worker_id = x.worker_id
RETURNING w.worker_id, w.host, w.ended_reason;

-- name: prune
-- Workers that ended more than `keep` seconds ago.
DELETE FROM workers WHERE ended_at < now() - make_interval(secs => %(keep)s);

-- name: list_workers
-- The fleet, alive workers first, newest first; each with its running tasks of `org_id`
-- alone (the workers are shared: another org's load on them is not the caller's to see), in
-- one pass over the running tasks, not one per worker.
SELECT w.worker_id, w.host, w.pid, w.version, w.slots, w.beat_seconds, w.state, w.started_at,
       w.last_beat, w.ended_at, w.ended_reason,
       extract(epoch FROM now() - w.last_beat)::float8 AS beat_age_seconds,
       coalesce(r.running, 0) AS running
FROM workers w
LEFT JOIN (
  SELECT s.worker_id, count(*) AS running FROM task_status s
  JOIN task_registry t ON t.task_id = s.task_id AND t.start_day = s.start_day
  WHERE s.status = 'running' AND t.org_id = %(org_id)s GROUP BY s.worker_id
) r ON r.worker_id = w.worker_id
WHERE %(state)s::text IS NULL OR w.state = %(state)s::text
ORDER BY (w.state = 'alive') DESC, w.started_at DESC, w.worker_id
LIMIT %(limit)s;
