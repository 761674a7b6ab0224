"""`trace demo` / `make demo`: the Monad demo end to end on the Lite stack.

Starts the embedded Postgres, the local object store, the devnet (or uses `--rpc-url`) and the
Lite stack; deploys the demo DAG (package data: `lite/dags/monad_demo.yaml`, the same file as
`examples/dags/monad_demo.yaml`); backfills the range with progress bars; then prints the three
analytics through the Query Service, writes PNG charts, and says where everything is. A second
run over the same range finds the data complete and only queries.

Modules, in the order a run uses them: `plan` (what to sync: chain, range, window sizes, the
last run's boundaries), `dag` (the demo DAG with the plan set into it), `data` (what the stores
already hold: named queries in `db/sql/demo.sql`, saved queries), `backfill` (trigger the run,
follow it with progress bars), `report` (tables, charts, where the outputs are), `run` (the
command itself)."""

from trace_platform.lite.demo.dag import DEMO_DAG, dag_text
from trace_platform.lite.demo.data import saved_rows
from trace_platform.lite.demo.plan import DemoPlan
from trace_platform.lite.demo.run import run_demo

__all__ = ["DEMO_DAG", "DemoPlan", "dag_text", "run_demo", "saved_rows"]
