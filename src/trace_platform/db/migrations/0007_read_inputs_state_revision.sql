-- An input may be read without its events starting the job (`triggers: false`): a job woken by
-- a range aggregator's manifest still reads the data it aggregated.
ALTER TABLE dag_subscriptions ADD COLUMN triggers BOOLEAN NOT NULL DEFAULT true;

-- Operator state is saved by compare-and-set on its revision, so two runs of one job cannot
-- both build on the same state (the second is retried with the state the first saved).
ALTER TABLE operator_state ADD COLUMN revision BIGINT NOT NULL DEFAULT 1;
