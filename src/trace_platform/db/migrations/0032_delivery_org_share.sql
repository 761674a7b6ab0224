-- Deliveries are leased org by org (db/sql/deliveries.sql, lease_due): each pass walks the orgs
-- with unsettled deliveries through this index (a loose index scan: one probe per org) and
-- takes each org's share of the batch, its oldest due first, so one org's backlog never holds
-- another's deliveries back.
CREATE INDEX deliveries_org_due_idx ON deliveries (org_id, next_attempt_at)
  WHERE status IN ('pending', 'sending');
