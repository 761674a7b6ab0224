-- A run's retry (`trace runs retry`, POST /v1/runs/{id}/retry): each of its failed tasks is
-- queued again with a fresh budget of tries. The attempts up to `after_attempt` stop counting as
-- tries from then on (dispatcher.sql's untried_attempts counts them with the attempts that
-- never were tries), so the task gets its max_attempts again while its attempt numbers keep
-- rising (a late report of an old attempt stays fenced off). One row per retry of a task; the
-- latest counts. Not partitioned: a row per manual retry of a failed task, few.
CREATE TABLE task_retries (
  task_id       UUID NOT NULL,
  after_attempt INT NOT NULL,
  run_id        UUID,
  retried_by    UUID,
  created_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
  PRIMARY KEY (task_id, after_attempt)
);
