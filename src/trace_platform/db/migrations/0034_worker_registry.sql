-- The worker registry (dispatcher/fleet.py): every `trace worker` process registers here on
-- start, beats on a thread of its own every `beat_seconds`, and marks itself stopped on a clean
-- exit. The reaper declares a worker whose last beat is older than three of its intervals dead
-- and ends its running attempts at once (a worker on another host that dies is seen then, not
-- only when its tasks' leases run out). A worker's tasks are those whose status row names its
-- `worker_id` (every wrapper of a worker claims under the worker's id).
CREATE TABLE workers (
  worker_id     TEXT PRIMARY KEY,           -- host:pid:nonce, made by the worker
  host          TEXT NOT NULL,              -- the host it advertises (TRACE_WORKER_HOST)
  pid           INTEGER NOT NULL CHECK (pid > 0),
  version       TEXT NOT NULL,              -- trace-platform's version it runs
  slots         INTEGER NOT NULL CHECK (slots > 0),  -- tasks it runs at once
  beat_seconds  DOUBLE PRECISION NOT NULL CHECK (beat_seconds > 0),
  state         TEXT NOT NULL DEFAULT 'alive' CHECK (state IN ('alive', 'stopped', 'dead')),
  started_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
  last_beat     TIMESTAMPTZ NOT NULL DEFAULT now(),
  ended_at      TIMESTAMPTZ,                -- stopped or declared dead
  ended_reason  TEXT,
  CHECK ((state = 'alive') = (ended_at IS NULL))
);
-- The reaper's scan: the live workers by when they last beat.
CREATE INDEX workers_alive_idx ON workers (last_beat) WHERE state = 'alive';
-- Retention: ended workers are deleted a while after they ended.
CREATE INDEX workers_ended_idx ON workers (ended_at) WHERE ended_at IS NOT NULL;
