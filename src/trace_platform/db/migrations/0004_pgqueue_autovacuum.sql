-- queue_messages churns (every message is inserted, updated, deleted): vacuum and analyse it
-- far more often than the defaults, so the receive plan stays an ordered index scan.
ALTER TABLE queue_messages SET (
  autovacuum_vacuum_scale_factor = 0.01,
  autovacuum_analyze_scale_factor = 0.02,
  autovacuum_vacuum_cost_delay = 0
);
