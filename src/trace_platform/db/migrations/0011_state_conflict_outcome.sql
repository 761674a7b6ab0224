-- An attempt whose operator-state save lost the compare-and-set (another run of the job saved
-- first) ends with its own outcome, `state_conflict`, as the reaper's attempts end with
-- `lease_expired` or `timed_out`. Such attempts cost no retry budget: the Dispatcher counts them
-- by this outcome. Attempts recorded before this migration were `failed` with the conflict's
-- message as their error; they are relabelled so tasks in flight keep their budget.
ALTER TABLE task_attempts DROP CONSTRAINT task_attempts_outcome_check;

UPDATE task_attempts
SET outcome = 'state_conflict'
WHERE outcome = 'failed'
  AND error = 'operator state changed while this attempt ran (another run of the job saved '
              'first); retrying on the newer state';

ALTER TABLE task_attempts ADD CONSTRAINT task_attempts_outcome_check
  CHECK (outcome IN ('running', 'succeeded', 'failed', 'canceled', 'lease_expired', 'timed_out',
                     'state_conflict'));
