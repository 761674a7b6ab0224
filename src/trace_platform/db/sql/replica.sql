-- Named queries of the read replica's lag check (db/replica.py). Both cheap: no table read.

-- name: primary_position
-- Where the primary's WAL is, and when by its clock: what the replica must have replayed to
-- show everything committed so far (the insert position: under synchronous_commit=off a
-- commit may not be written out yet).
SELECT pg_current_wal_insert_lsn()::text AS lsn, clock_timestamp() AS at, current_database() AS db,
       (SELECT system_identifier FROM pg_control_system()) AS system;

-- name: replica_position
-- How far the replica replayed, and the commit time of the last transaction it replayed (null
-- when it replayed none since it started); on a server that is not a standby both are null.
SELECT pg_is_in_recovery() AS standby, pg_last_wal_replay_lsn()::text AS lsn,
       pg_last_xact_replay_timestamp() AS replayed_at, current_database() AS db,
       (SELECT system_identifier FROM pg_control_system()) AS system;
