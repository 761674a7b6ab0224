-- Retention's check before a drop compares whole rows, not only keys: a row updated in place
-- after its export (a reaped attempt's late success rewrites its outcome) changes no key, so
-- count and key checksum alone let the partition drop with the export still holding the old
-- row. row_checksum: the sum of hashtextextended(row text) over the rows the export read, in
-- its snapshot (NULL for an export recorded before this: unknown, so the check re-exports).
ALTER TABLE retention_exports ADD COLUMN row_checksum NUMERIC;
