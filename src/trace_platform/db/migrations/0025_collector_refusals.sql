-- The collector deletes only what the platform made (layout.platform_made: files under a
-- version's own prefix of the row's org, tables named dataset_<hex>.v_<hex>). Anything else it
-- is asked to retire is logged and left, with the reason here, and never asked about again.
ALTER TABLE retired_locations ADD COLUMN refused TEXT;
