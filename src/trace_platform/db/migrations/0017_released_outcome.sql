-- An attempt a worker hands back when it shuts down (its drain grace ran out before the
-- operator finished) ends `released`: the task is queued again at once and, like a lost state
-- race, the attempt is not one of its tries.
ALTER TABLE task_attempts DROP CONSTRAINT task_attempts_outcome_check;
ALTER TABLE task_attempts ADD CONSTRAINT task_attempts_outcome_check
  CHECK (outcome IN ('running', 'succeeded', 'failed', 'canceled', 'lease_expired', 'timed_out',
                     'state_conflict', 'released'));
