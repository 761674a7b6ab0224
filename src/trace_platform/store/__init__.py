"""The one owner of the state store: every read and write of Postgres state goes through a
module here, one per named-SQL group (`db/sql/<group>.sql`), each call with typed parameters.

- `tasks/`: the task lifecycle's store (tasks, attempts, leases, outbox, pool slots, operator
  state, events, commits), a narrow protocol with a Postgres store and an in-memory twin.
- the other modules: the registry and control-plane halls' calls on the caller's connection.
"""
