-- pgqueue: the Postgres-backed QueueDriver of the Lite profile (DDL exactly as in the
-- deployment-profiles note).

CREATE TABLE queue_messages (
  id            BIGSERIAL PRIMARY KEY,
  queue_name    TEXT NOT NULL,
  payload       JSONB NOT NULL,

  created_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
  visible_at    TIMESTAMPTZ NOT NULL DEFAULT now(),

  lease_until   TIMESTAMPTZ,
  lease_token   UUID,

  attempts      INT NOT NULL DEFAULT 0,
  max_attempts  INT NOT NULL DEFAULT 20,

  last_error    TEXT
);

CREATE INDEX queue_ready_idx
  ON queue_messages (queue_name, visible_at, id);

CREATE INDEX queue_lease_idx
  ON queue_messages (queue_name, lease_until);

CREATE TABLE queue_dead (
  id           BIGINT PRIMARY KEY,
  queue_name   TEXT NOT NULL,
  payload      JSONB NOT NULL,
  created_at   TIMESTAMPTZ NOT NULL,
  dead_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
  attempts     INT NOT NULL,
  last_error   TEXT
);
