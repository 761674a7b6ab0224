-- What a running attempt last reported of its progress (an operator's ctx.progress, carried by
-- the wrapper's heartbeat): shown by `trace runs show` and the demo's bars. A new attempt starts
-- with none.
ALTER TABLE task_status ADD COLUMN progress JSONB;
ALTER TABLE task_status ADD COLUMN progress_at TIMESTAMPTZ;
