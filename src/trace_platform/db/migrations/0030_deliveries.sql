-- Deliveries (issue 40): where alerts go and what was sent.
--
-- destinations: an org's webhook endpoints, managed by admins. The signing secret is sealed by
-- the vault (Standard Webhooks: whsec_<base64>). `allow_private` is an admin's explicit
-- permission to send to a loopback, private or link-local address or a platform port.
CREATE TABLE destinations (
  org_id          UUID NOT NULL REFERENCES orgs,
  name            TEXT NOT NULL,
  url             TEXT NOT NULL,
  secret          TEXT NOT NULL,          -- sealed by the vault
  enabled         BOOLEAN NOT NULL DEFAULT true,
  allow_private   BOOLEAN NOT NULL DEFAULT false,
  created_by      UUID,
  created_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
  updated_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
  PRIMARY KEY (org_id, name)
);

-- deliveries: one per (alert, destination), made when the sink lands an alert_deliveries batch,
-- in the same state transaction as the record (with its outbox wake-up). The body is fixed at
-- creation: the same idempotency key always carries the same body. Leased like a task attempt
-- (`lease_token`, fenced); never canceled by deploys, cutovers, rollbacks or pauses.
--   suppressed (older than max_delivery_age: recorded, never sent)
--   pending -> sending (leased) -> delivered | pending (retry at next_attempt_at) | failed
CREATE TABLE deliveries (
  delivery_id      UUID PRIMARY KEY,
  org_id           UUID NOT NULL,
  idempotency_key  TEXT NOT NULL,
  destination      TEXT NOT NULL,
  record_id        UUID NOT NULL,          -- the alert_deliveries batch it came from
  rule             TEXT NOT NULL,
  severity         TEXT NOT NULL,
  event_time       TIMESTAMPTZ NOT NULL,
  body             TEXT NOT NULL,          -- the exact bytes every attempt sends
  status           TEXT NOT NULL CHECK (status IN ('suppressed', 'pending', 'sending',
                                                   'delivered', 'failed')),
  reason           TEXT,                   -- why suppressed, or why it failed for good
  attempts         INT NOT NULL DEFAULT 0,
  lease_token      UUID,
  lease_expires_at TIMESTAMPTZ,
  next_attempt_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
  created_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
  finished_at      TIMESTAMPTZ,
  UNIQUE (org_id, idempotency_key)
);
CREATE INDEX deliveries_due_idx ON deliveries (next_attempt_at) WHERE status IN ('pending', 'sending');
CREATE INDEX deliveries_org_idx ON deliveries (org_id, created_at);

-- Every attempt: its outcome, latency and error, whatever happened.
CREATE TABLE delivery_attempts (
  delivery_id   UUID NOT NULL REFERENCES deliveries,
  attempt       INT NOT NULL,
  started_at    TIMESTAMPTZ NOT NULL,
  finished_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
  status_code   INT,
  latency_ms    INT,
  outcome       TEXT NOT NULL,           -- delivered | retry | failed | refused
  error         TEXT,
  address       TEXT,                    -- the address it was sent to (checked at send time)
  PRIMARY KEY (delivery_id, attempt)
);
