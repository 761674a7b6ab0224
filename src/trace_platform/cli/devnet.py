"""`trace devnet up|down|status`: the local chain."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from trace_platform.cli.safe_text import safe
from trace_platform.config import get_settings
from trace_platform.devnet import ChainSpec, Devnet, DevnetError

devnet_app = typer.Typer(help="The local devnet chain (a real anvil node).", no_args_is_help=True)
console = Console()


@devnet_app.command("up")
def up(
    blocks: Annotated[int, typer.Option(min=10)] = 2000,
    accounts: Annotated[int, typer.Option(min=10)] = 200,
    validators: Annotated[int, typer.Option(min=1)] = 10,
    seed: Annotated[int, typer.Option()] = 7,
    epoch_blocks: Annotated[int, typer.Option(min=5)] = 100,
) -> None:
    """Start the devnet and generate its seeded activity (reused when already there)."""
    spec = ChainSpec(
        seed=seed,
        blocks=blocks,
        accounts=accounts,
        validators=validators,
        epoch_blocks=epoch_blocks,
    )
    devnet = Devnet(get_settings().home)
    with Progress(
        TextColumn("generating blocks"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    ) as bar:
        task = bar.add_task("blocks", total=blocks)
        try:
            info, chain = devnet.up(spec, lambda b: bar.update(task, completed=b))
        except DevnetError as e:
            console.print(f"[red]error:[/red] {safe(e)}")
            raise typer.Exit(1) from None
        bar.update(task, completed=blocks)
    console.print(f"devnet at {info.url} (chain id {info.chain_id}), head {chain.head}")
    console.print(f"  token   {chain.token}\n  staking {chain.staking}")


@devnet_app.command("down")
def down() -> None:
    """Stop the devnet (its chain is regenerated on the next `up`)."""
    Devnet(get_settings().home).down()
    console.print("devnet stopped")


@devnet_app.command("status")
def status() -> None:
    """Is the devnet running, where, and what is on it."""
    table = Table("key", "value", title="devnet")
    for k, v in Devnet(get_settings().home).status().items():
        table.add_row(k, safe(v))
    console.print(table)
