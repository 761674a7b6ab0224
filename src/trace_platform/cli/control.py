"""`trace dag|runs|datasets|secrets|users`: the control plane for people, acting as a user."""

from __future__ import annotations

import json
import sys
import time
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn
from uuid import UUID

import typer
from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.tree import Tree

from trace_platform.cli.safe_text import safe
from trace_platform.config import get_settings
from trace_platform.contract import progress_text
from trace_platform.dag.schema import DagSpec
from trace_platform.dag.validate import DagInvalid, load
from trace_platform.errors import TraceError
from trace_platform.identity import Actor, authenticate
from trace_platform.lite.bootstrap import key_file

if TYPE_CHECKING:
    from trace_platform.services import Services

console = Console()
dag_app = typer.Typer(help="DAGs: validate, deploy, trigger.", no_args_is_help=True)
runs_app = typer.Typer(
    help="Runs: a trigger firing and the tree of tasks it started.", no_args_is_help=True
)
datasets_app = typer.Typer(help="The dataset registry.", no_args_is_help=True)
secrets_app = typer.Typer(
    help="Secrets for worker pool slots (values never printed).", no_args_is_help=True
)
users_app = typer.Typer(help="Users and their org roles.", no_args_is_help=True)

STATUS_COLOUR = {
    "succeeded": "green",
    "empty": "yellow",
    "timeout": "yellow",
    "failed": "red",
    "canceled": "yellow",
    "running": "cyan",
    "queued": "white",
}


def fail(message: str) -> NoReturn:
    console.print(f"[red]error:[/red] {safe(message)}")
    raise typer.Exit(1)


@cache
def services() -> Services:
    # Here, not at import: every `trace` command (a worker's start too) would pay for the
    # whole control plane's imports otherwise.
    from trace_platform.services import Services

    svc = Services.build(get_settings())
    if svc.new_admin_key:
        console.print(
            f"[bold yellow]Created the Lite admin API key[/bold yellow] (shown once, saved to "
            f"{key_file(svc.settings)}):\n  {svc.new_admin_key}"
        )
    return svc


def me() -> Actor:
    """The user this CLI acts as: TRACE_API_KEY, else the Lite admin key file."""
    svc = services()
    s = svc.settings
    key = s.api_key.get_secret_value() if s.api_key else None
    if key is None and key_file(s).exists():
        key = key_file(s).read_text().strip()
    with svc.pool.connection() as conn:
        actor = authenticate(conn, key)
    if actor is None:
        fail(
            "no valid API key: set TRACE_API_KEY, or use the Lite admin key in "
            f"{key_file(s)} (created on first start)"
        )
    return actor


def run_op(fn: Any, *args: Any, **kw: Any) -> Any:
    try:
        return fn(*args, **kw)
    except DagInvalid as e:
        console.print(f"[red]{len(e.problems)} problem(s):[/red]")
        for p in e.problems:
            console.print("  " + safe(p.render(e.source)), highlight=False)
        raise typer.Exit(1) from None
    except TraceError as e:
        fail(e.message)


def status_text(status: str) -> str:
    c = STATUS_COLOUR.get(status, "white")
    return f"[{c}]{status}[/{c}]"


# -- dag -----------------------------------------------------------------------------------
@dag_app.command("validate")
def dag_validate(files: Annotated[list[Path], typer.Argument(help="DAG YAML files")]) -> None:
    """Check DAG files; prints every problem at once (file, job, field)."""
    bad = 0
    for f in files:
        try:
            spec = load(f)
            console.print(
                f"[green]ok[/green] {safe(f)}: DAG '{safe(spec.name)}', {len(spec.jobs)} job(s)"
            )
        except DagInvalid as e:
            bad += 1
            for p in e.problems:
                console.print(safe(p.render(e.source)), highlight=False)
    raise typer.Exit(1 if bad else 0)


@dag_app.command("schema")
def dag_schema() -> None:
    """The JSON Schema of DAG files (for editors)."""
    sys.stdout.write(json.dumps(DagSpec.model_json_schema(by_alias=True), indent=2) + "\n")


@dag_app.command("list")
def dag_list() -> None:
    """DAGs of your org."""
    table = Table("dag", "active version", "deployed", "owner", "paused", "you may deploy")
    for d in run_op(services().control.list_dags, me()):
        table.add_row(
            safe(d["name"]),
            str(d["active_version"]),
            str(d["deployed_at"])[:19],
            safe(d["owner"]),
            str(d["paused"]),
            str(d["can_deploy"]),
        )
    console.print(table)


@dag_app.command("show")
def dag_show(name: str, version: Annotated[int | None, typer.Option()] = None) -> None:
    """One DAG version: jobs, wiring, publishes, triggers."""
    d = run_op(services().control.show_dag, me(), name, version)
    console.print(
        f"[bold]{safe(d['name'])}[/bold] version {d['version']} (active {d['active_version']}), deployed {d['deployed_at']:%Y-%m-%d %H:%M:%S}"
    )
    spec = d["spec"]
    table = Table("job", "operator", "runtime", "inputs", "outputs", "pool", "max attempts")
    for job, j in spec["jobs"].items():
        inputs = ", ".join(
            i["job"] + f"[{i['output']}]" if "job" in i else "dataset:" + i["from"]["dataset"]
            for i in j["inputs"]
        )
        table.add_row(
            safe(job),
            safe(j["operator"]),
            safe(j["runtime"]),
            safe(inputs),
            str(len(j["outputs"])),
            safe(j["worker_pool"] or ""),
            str(j["max_attempts"]),
        )
    console.print(table)
    for p in spec["publish"]:
        console.print(
            f"  publishes {safe(p['job'])}[{p['output_index']}] as "
            f"[cyan]{safe(p['dataset'])}[/cyan]"
        )
    for c in spec["triggers"]["cron"]:
        console.print(f"  cron {safe(c['name'])}: {safe(c['schedule'])}")
    for w in spec["triggers"]["webhooks"]:
        console.print(
            f"  webhook {safe(w['name'])}: POST /v1/hooks/{safe(d['name'])}/{safe(w['name'])}"
        )


@dag_app.command("grant")
def dag_grant(name: str, roles: Annotated[list[str], typer.Argument()]) -> None:
    """Set the roles that may deploy and trigger a DAG (admins only)."""
    run_op(services().control.set_deploy_roles, me(), name, roles)
    console.print(
        f"DAG '{safe(name)}' deploy roles: {safe(', '.join(sorted(set(roles)))) or '(none)'}"
    )


def follow_run(run_id: UUID, timeout: float | None = None) -> str:
    """Live tree of the run until nothing is queued or running; returns the final status
    (`empty`: it started no task, so there is nothing to wait on; `timeout`: still running
    when `timeout` seconds passed)."""
    cp, actor = services().control, me()
    deadline = None if timeout is None else time.monotonic() + timeout
    with Live(console=console, refresh_per_second=6) as live:
        while True:
            run = cp.show_run(actor, run_id)
            live.update(run_tree(run))
            statuses = [t["status"] for t in run["tasks"]]
            if not statuses:
                return "empty"
            if not any(s in ("queued", "running", "buffered") for s in statuses):
                if "failed" in statuses:
                    return "failed"
                return "canceled" if "succeeded" not in statuses else "succeeded"
            if deadline is not None and time.monotonic() >= deadline:
                return "timeout"
            time.sleep(0.2)


WaitTimeout = Annotated[
    float | None, typer.Option(help="with --wait: give up after this many seconds (exit 2)")
]


def finish_wait(run_id: UUID, timeout: float | None) -> NoReturn:
    status = follow_run(run_id, timeout)
    console.print(f"run {run_id}: {status_text(status)}")
    raise typer.Exit({"succeeded": 0, "timeout": 2}.get(status, 1))


@dag_app.command("trigger")
def dag_trigger(
    name: str,
    config: Annotated[str, typer.Option(help="run config as JSON")] = "{}",
    wait: Annotated[bool, typer.Option(help="follow the run until it finishes")] = False,
    timeout: WaitTimeout = None,
) -> None:
    """Start a run of a DAG now (its source jobs: those that read no input)."""
    try:
        cfg = json.loads(config)
    except json.JSONDecodeError as e:
        fail(f"--config is not valid JSON: {e}")
    res = run_op(services().control.trigger, me(), name, config=cfg)
    console.print(f"run {res['run_id']} started ({len(res['tasks'])} source task(s))")
    if wait:
        if not res["tasks"]:  # a firing already recorded (same idempotency key): no new work
            console.print(f"run {res['run_id']}: nothing new to wait on")
            raise typer.Exit(0)
        finish_wait(res["run_id"], timeout)


@dag_app.command("backfill")
def dag_backfill(
    name: str,
    job: Annotated[
        list[str] | None, typer.Option("--job", help="a job to backfill (default: all)")
    ] = None,
    from_block: Annotated[int | None, typer.Option(help="first block (inclusive)")] = None,
    to_block: Annotated[int | None, typer.Option(help="last block (inclusive)")] = None,
    scope: Annotated[
        list[str] | None, typer.Option("--scope", help="a scope, e.g. range:0-100")
    ] = None,
    dry_run: Annotated[bool, typer.Option(help="show the plan, start nothing")] = False,
    wait: Annotated[bool, typer.Option(help="follow the run until it finishes")] = False,
    timeout: WaitTimeout = None,
) -> None:
    """Replay what the inputs of a DAG's jobs already hold (all of it, a block range or chosen
    scopes) for the chosen jobs, and so their downstream, as one run. Idempotent under the
    jobs' update strategies; cancel it whole with `trace runs cancel RUN`."""
    res = run_op(
        services().control.changes.backfill,
        me(),
        name,
        jobs=job or [],
        from_block=from_block,
        to_block=to_block,
        scopes=scope or [],
        dry_run=dry_run,
    )
    table = Table("job", "scopes", "of", "first scopes")
    for j, p in res["jobs"].items():
        of = ", ".join(f"{n} of {src}" for src, n in sorted(p["sources"].items()))
        more = f" … (+{p['tasks'] - len(p['scopes'])})" if p["tasks"] > len(p["scopes"]) else ""
        table.add_row(safe(j), str(p["tasks"]), safe(of), safe(", ".join(p["scopes"])) + more)
    console.print(table)
    if not res["tasks"]:
        console.print("nothing to backfill: the inputs hold no history in the scopes asked")
        raise typer.Exit(0)
    if dry_run:
        console.print(f"would replay {res['tasks']} scope(s) (dry run: nothing started)")
        raise typer.Exit(0)
    console.print(f"run {res['run_id']} started: {res['tasks']} scope(s) to replay")
    if wait:
        finish_wait(res["run_id"], timeout)


# -- runs ------------------------------------------------------------------------------------
@runs_app.command("list")
def runs_list(dag: Annotated[str | None, typer.Option()] = None, limit: int = 20) -> None:
    """Recent runs with their status."""
    table = Table("run", "dag", "version", "trigger", "started", "tasks", "status")
    for r in run_op(services().control.list_runs, me(), dag, limit):
        table.add_row(
            str(r["run_id"]),
            safe(r["dag"]),
            str(r["dag_version"]),
            safe(f"{r['kind']}:{r['trigger']}"),
            f"{r['created_at']:%H:%M:%S}",
            str(r["tasks"]),
            status_text(r["status"]),
        )
    console.print(table)


def run_tree(run: dict[str, Any]) -> Tree:
    root = Tree(
        f"run {run['run_id']} — {safe(run['dag'])} v{run['dag_version']} "
        f"({safe(run['kind'])}:{safe(run['trigger'])})"
    )
    nodes: dict[Any, Tree] = {}
    for t in run["tasks"]:
        dur = ""
        if t["started_at"] and t["finished_at"]:
            dur = f" {(t['finished_at'] - t['started_at']).total_seconds():.2f}s"
        label = f"{safe(t['job'])} [dim]{str(t['task_id'])[:8]}[/dim] {status_text(t['status'])} attempt {t['attempt']}{dur}"
        if t.get("progress"):  # what the attempt last reported (operator text)
            label += f" [cyan]{safe(progress_text(t['progress']), one_line=True)}[/cyan]"
        if t["last_error"] and t["status"] != "succeeded":
            label += f" [red]{safe(t['last_error'][:60], one_line=True)}[/red]"
        parent = nodes.get(t["parent_task_id"], root)
        nodes[t["task_id"]] = parent.add(label)
    return root


@runs_app.command("show")
def runs_show(run_id: UUID) -> None:
    """The task tree of a run: status, attempts, durations, each task's last progress report."""
    console.print(run_tree(run_op(services().control.show_run, me(), run_id)))


@runs_app.command("cancel")
def runs_cancel(run_id: UUID) -> None:
    """Cancel every unfinished task of a run (a backfill, a trigger's run): queued ones at
    once, running ones cooperatively (they stop and emit nothing)."""
    res = run_op(services().control.cancel_run, me(), run_id)
    console.print(f"run {run_id}: {res['canceled']} task(s) canceled")


@runs_app.command("retry")
def runs_retry(run_id: UUID) -> None:
    """Queue again every task of a run that ended failed (timed out or lost its lease on its
    last try included), each with a fresh budget of tries; canceled ones stay canceled, and the
    tasks under a failed one follow once it succeeds."""
    res = run_op(services().control.retry_run, me(), run_id)
    console.print(f"run {run_id}: {res['message']}")


# -- datasets ------------------------------------------------------------------------------
@datasets_app.command("list")
def datasets_list() -> None:
    """Published datasets you may read."""
    table = Table(
        "dataset", "uuid", "backend", "current version", "producer", "read roles", "rows", "bytes"
    )
    for d in run_op(services().control.list_datasets, me()):
        table.add_row(
            safe(d["dataset_name"]),
            str(d["dataset_uuid"]),
            safe(d["backend"]),
            str(d["current_version"]),
            safe(f"{d['producer_dag']}.{d['producer_job']}[{d['producer_output_index']}]"),
            safe(", ".join(d["read_roles"])) or "(private)",
            str(d["row_count"] or "-"),
            str(d["byte_count"] or "-"),
        )
    console.print(table)


@datasets_app.command("show")
def datasets_show(name: str) -> None:
    """One dataset."""
    d = run_op(services().control.show_dataset, me(), name)
    table = Table(show_header=False, title=f"dataset {safe(name)}")
    for k in (
        "dataset_uuid",
        "backend",
        "location",
        "update_strategy",
        "current_version",
        "producer_dag",
        "producer_job",
        "producer_output_index",
        "read_roles",
        "commits",
        "row_count",
        "byte_count",
    ):
        table.add_row(k, safe(d[k]))
    console.print(table)


@datasets_app.command("versions")
def datasets_versions(name: str) -> None:
    """Every version of a dataset, newest first, and what still needs each one."""
    table = Table(
        "version",
        "state",
        "dag version",
        "created",
        "commits",
        "rows",
        "bytes",
        "current",
        "map of",
        "rollback from",
        title=f"versions of {safe(name)}",
    )
    for v in run_op(services().control.dataset_versions, me(), name):
        maps = [m for m, on in (("active", v["active_map"]), ("building", v["building_map"])) if on]
        table.add_row(
            str(v["dataset_version"]),
            safe(v["state"]),
            str(v["dag_version"]),
            f"{v['created_at']:%Y-%m-%d %H:%M:%S}",
            str(v["commits"]),
            str(v["row_count"] or "-"),
            str(v["byte_count"] or "-"),
            "yes" if v["current"] else "",
            ", ".join(maps),
            ", ".join(map(str, v["rollback_versions"])),
        )
    console.print(table)


@datasets_app.command("purge")
def datasets_purge(
    name: str,
    keep: Annotated[int, typer.Option(help="newest complete versions to keep")],
    dry_run: Annotated[bool, typer.Option(help="list what would go; change nothing")] = False,
) -> None:
    """Purge old versions of a dataset (admins only). Always kept besides the newest: the
    current version, building ones and those the DAG's active or building version maps."""
    res = run_op(services().control.purge_versions, me(), name, keep, dry_run=dry_run)
    verb = "would purge" if dry_run else "purged"
    table = Table(
        "version", "state", "dag version", "created", "commits", title=f"{verb}: {safe(name)}"
    )
    for v in res["purged"]:
        table.add_row(
            str(v["dataset_version"]),
            safe(v["state"]),
            str(v["dag_version"]),
            f"{v['created_at']:%Y-%m-%d %H:%M:%S}",
            str(v["commits"]),
        )
    console.print(table)
    for k in res["kept"]:
        console.print(f"  kept {k['dataset_version']} ({safe(', '.join(k['reasons']))})")
    console.print(
        f"{verb} {len(res['purged'])} version(s), {res['commits']} commit(s); "
        f"{len(res['locations'])} location(s) retired"
        + ("" if dry_run else " (deleted once no running query reads them)")
    )
    if res["rollback_lost"]:
        lost = ", ".join(map(str, res["rollback_lost"]))
        console.print(f"  DAG version(s) {lost} can no longer be rolled back to in full")


@datasets_app.command("grant")
def datasets_grant(name: str, roles: Annotated[list[str], typer.Argument()]) -> None:
    """Add roles to a dataset's read_roles (admins only)."""
    now = run_op(services().control.set_read_roles, me(), name, roles, [])
    console.print(f"{safe(name)} read_roles: {safe(', '.join(now))}")


@datasets_app.command("revoke")
def datasets_revoke(name: str, roles: Annotated[list[str], typer.Argument()]) -> None:
    """Remove roles from a dataset's read_roles (admins only)."""
    now = run_op(services().control.set_read_roles, me(), name, [], roles)
    console.print(f"{safe(name)} read_roles: {safe(', '.join(now)) or '(private)'}")


# -- secrets and users ---------------------------------------------------------------------
@secrets_app.command("set")
def secrets_set(
    name: str,
    use_role: Annotated[
        list[str] | None,
        typer.Option(help="a role whose holders may use it in their DAGs (repeatable)"),
    ] = None,
) -> None:
    """Store a secret you own (or overwrite one you own / as an admin); the value is read from
    stdin and never printed. --use-role replaces its use_roles (omitted: kept)."""
    value = sys.stdin.read().rstrip("\n")
    s = run_op(services().control.set_secret, me(), name, value, use_role)
    verb = "created" if s["created"] else "updated"
    roles = safe(", ".join(s["use_roles"])) or "(owner and admins only)"
    console.print(f"secret '{safe(name)}' {verb} ({len(value)} characters); use roles: {roles}")


@secrets_app.command("list")
def secrets_list() -> None:
    """Secrets you own or may use (all of the org's for admins): names, owners, use roles and
    update times, never values."""
    table = Table("secret", "owner", "use roles", "updated")
    for s in run_op(services().control.list_secrets, me()):
        table.add_row(
            safe(s["name"]),
            safe(s["owner"] or "(admins)"),
            safe(", ".join(s["use_roles"])) or "-",
            f"{s['updated_at']:%Y-%m-%d %H:%M:%S}",
        )
    console.print(table)


@users_app.command("add")
def users_add(
    name: str,
    role: Annotated[list[str] | None, typer.Option(help="org role (repeatable)")] = None,
    admin: Annotated[bool, typer.Option()] = False,
) -> None:
    """Create a user (or update their roles) and print a new API key for them (shown once)."""
    user = run_op(services().control.add_user, me(), name, role or [], admin)
    console.print(
        f"user '{safe(name)}' roles: {safe(', '.join(user['roles'])) or '(none)'}"
        f"{' (admin)' if admin else ''}"
    )
    console.print(f"API key (shown once): {user['api_key']}")
