-- Alerts (issue 40): the org-wide buffered datasets the platform itself declares. `platform`
-- names which one a buffered dataset is ('alert_events', 'alert_deliveries'); NULL for a
-- dataset a DAG declares. Their writers are every job of the org that runs the operator that
-- feeds them (alert_evaluate, alert_route), kept by each DAG's deploys.
ALTER TABLE buffered_datasets ADD COLUMN platform TEXT
  CHECK (platform IN ('alert_events', 'alert_deliveries'));
