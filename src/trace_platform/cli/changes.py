"""`trace dag deploy|diff|status|cutover|rollback|pause|resume`: changing a running DAG."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from trace_platform.cli.control import console, dag_app, fail, me, run_op, services
from trace_platform.cli.safe_text import safe

if TYPE_CHECKING:
    from trace_platform.registry.deploy import DeployResult


def _read(file: Path) -> str:
    try:
        return file.read_text()
    except OSError as e:
        fail(f"cannot read {file}: {e.strerror}")


def print_plan(res: DeployResult, *, dry_run: bool) -> None:
    """What a deploy changed (or would change): jobs, rebuild, replays, what serves."""
    if res.changes:
        table = Table("job", "change", "affects data", "fields")
        for c in res.changes:
            table.add_row(
                safe(c.job),
                safe(c.change),
                "yes" if c.affects_materialization else "no",
                safe(", ".join(c.fields)),
            )
        console.print(table)
    elif not res.created:
        console.print("no job changed")
    if res.abandoned is not None:
        console.print(f"[yellow]supersedes the rebuild of version {res.abandoned}[/yellow]")
    if res.rebuilt_jobs:
        verb = "would rebuild" if dry_run else "rebuilding"
        console.print(f"{verb}: {safe(', '.join(res.rebuilt_jobs))}")
    if res.rebuilt_jobs or res.replays:
        replays = Table("job", "replays", "of", "scopes")
        for job, r in sorted(res.replays.items()):
            more = f" … (+{r.tasks - len(r.scopes)})" if r.tasks > len(r.scopes) else ""
            of = ", ".join(f"{n} of {src}" for src, n in sorted(r.sources.items()))
            replays.add_row(safe(job), str(r.tasks), safe(of), safe(", ".join(r.scopes)) + more)
        console.print(replays)
    if res.live and res.replays:
        verb = "will replay" if dry_run else "replaying"
        for job, r in sorted(res.replays.items()):
            of = ", ".join(f"{n} scope(s) of `{src}`" for src, n in sorted(r.sources.items()))
            run = f" (run {r.run_id})" if r.run_id else ""
            console.print(f"{safe(job)} {verb} the history it reads: {safe(of)}{run}")
    if not res.live:
        how = f"`trace dag cutover {safe(res.name)}`" if res.manual_cutover else "automatically"
        console.print(
            f"version {res.version} builds beside version {res.active_version}, which keeps "
            f"serving; it goes live {how} once complete (`trace dag status {safe(res.name)}`)"
        )


@dag_app.command("deploy")
def dag_deploy(
    file: Path,
    manual_cutover: Annotated[
        bool, typer.Option(help="Wait for `trace dag cutover` once the rebuild is complete.")
    ] = False,
) -> None:
    """Deploy a DAG file as a new immutable version. A change to what jobs produce is built
    beside the live version and goes live at cutover; any other change is live at once."""
    res = run_op(
        services().control.deploy, me(), _read(file), str(file), manual_cutover=manual_cutover
    )
    verb = "created" if res.created else "deployed"
    state = "live" if res.live else "building"
    console.print(f"DAG '{safe(res.name)}' {verb}: version {res.version} ({state})")
    print_plan(res, dry_run=False)
    for name, uuid_ in res.datasets.items():
        console.print(f"  published {safe(name)} -> {uuid_}")


@dag_app.command("diff")
def dag_diff(file: Path) -> None:
    """What deploying FILE would change: jobs, whether each change alters their data, the
    downstream that would be rebuilt and the history it would replay. Changes nothing."""
    res = run_op(services().control.deploy, me(), _read(file), str(file), dry_run=True)
    if res.created:
        console.print(f"DAG '{safe(res.name)}' does not exist yet: deploying creates it")
    print_plan(res, dry_run=True)


@dag_app.command("status")
def dag_status(name: str) -> None:
    """The live version, a rebuild in flight (per job: done of total) and the versions."""
    s: dict[str, Any] = run_op(services().control.changes.status, me(), name)
    paused = " [yellow](paused)[/yellow]" if s["paused"] else ""
    console.print(f"[bold]{safe(s['name'])}[/bold]: version {s['active_version']} live{paused}")
    rb = s.get("rebuild")
    if rb:
        how = "manual cutover" if rb["manual_cutover"] else "automatic cutover"
        console.print(f"version {rb['version']} building ({how})")
        jobs = Table("job", "done", "of", "waiting", "held", "failed")
        for j in rb["jobs"]:
            jobs.add_row(
                safe(j["job"]),
                str(j["succeeded"]),
                str(j["tasks"] - j["buffered"] - j["canceled"]),
                str(j["pending"]),
                str(j["buffered"]),
                str(j["failed"]),
            )
        console.print(jobs)
        ds = Table("dataset", "job", "state", "commits", "rows")
        for d in rb["datasets"]:
            if d["state"] == "building":
                ds.add_row(
                    safe(d["dataset_name"] or d["dataset_uuid"]),
                    safe(d["job"]),
                    safe(d["state"]),
                    str(d["commits"]),
                    str(d["row_count"]),
                )
        console.print(ds)
        console.print(
            f"[yellow]waiting: {safe(rb['blocked_by'])}[/yellow]"
            if rb["blocked_by"]
            else "ready to cut over"
        )
    versions = Table("version", "state", "deployed", "went live")
    for v in s["versions"][:10]:
        versions.add_row(
            str(v["version"]),
            safe(v["state"]),
            f"{v['deployed_at']:%Y-%m-%d %H:%M:%S}",
            f"{v['activated_at']:%Y-%m-%d %H:%M:%S}" if v["activated_at"] else "",
        )
    console.print(versions)


@dag_app.command("cutover")
def dag_cutover(name: str) -> None:
    """Make a completed rebuild live: every dataset pointer and the version, at once."""
    r = run_op(services().control.changes.cutover, me(), name)
    console.print(
        f"DAG '{safe(r['dag'])}' cut over to version {r['version']} (from {r['previous']}): "
        f"{r['datasets_swapped']} datasets swapped, {r['released']} held tasks released, "
        f"{r['canceled']} superseded tasks canceled"
    )


@dag_app.command("rollback")
def dag_rollback(
    name: str,
    to: Annotated[
        int | None, typer.Option(help="The version to restore (default: the previous live one).")
    ] = None,
) -> None:
    """Restore an earlier version at once (pointers and version in one transaction); the
    rolled-back version's work is canceled. During a rebuild: abandon the rebuild."""
    r = run_op(services().control.changes.rollback, me(), name, to)
    if r["rolled_back"] is None:
        console.print(
            f"abandoned the rebuild of version {r['abandoned']}; version {r['version']} stays live"
        )
        return
    console.print(
        f"DAG '{safe(r['dag'])}' rolled back to version {r['version']} (from {r['rolled_back']}): "
        f"{r['datasets_swapped']} datasets swapped, {r['canceled']} tasks canceled"
    )
    if r["replays"]:
        caught = safe(", ".join(f"{j} {n}" for j, n in sorted(r["replays"].items())))
        console.print(f"  catching up on what came meanwhile: {caught}")


@dag_app.command("pause")
def dag_pause(name: str) -> None:
    """Hold the DAG: its tasks are still recorded but none starts; running ones finish."""
    r = run_op(services().control.changes.set_paused, me(), name, True)
    console.print(f"DAG '{safe(r['dag'])}' paused")


@dag_app.command("resume")
def dag_resume(name: str) -> None:
    """Let a paused DAG's waiting tasks run."""
    r = run_op(services().control.changes.set_paused, me(), name, False)
    console.print(f"DAG '{safe(r['dag'])}' resumed ({r['woken']} waiting tasks woken)")
