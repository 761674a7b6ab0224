"""Retention by partition: old months of task history exported to Parquet in the object store,
read back and checked, then detached and dropped (`trace admin retention`, run.py); the export
stays readable as history datasets (history.py)."""
