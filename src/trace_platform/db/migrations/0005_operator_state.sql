-- Durable operator state per (org, dag, job): read with the task payload, written atomically
-- with a successful, attempt-fenced completion (range aggregators, tip followers).
CREATE TABLE operator_state (
  org_id           UUID NOT NULL,
  dag_id           UUID NOT NULL,
  job              TEXT NOT NULL,
  state            JSONB NOT NULL,
  updated_by_task  UUID NOT NULL,
  updated_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
  PRIMARY KEY (org_id, dag_id, job)
);
