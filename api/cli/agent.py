"""`cutpoint agent bench`: the host agent's pause-window benchmark."""

from __future__ import annotations

import sys

import typer

app = typer.Typer(help="The host agent cutpointd.", no_args_is_help=True)


def _log(msg: str) -> None:
    typer.echo(msg)
    sys.stdout.flush()


@app.command()
def bench(
    rounds: int = typer.Option(50, "--rounds", min=1, max=10000,
                               help="group snapshots per snapshot method"),
    json_out: str = typer.Option("out/bench-agent.json", "--json",
                                 help="write the results to this JSON file"),
    keep_lab: bool = typer.Option(False, "--keep-lab", help="leave the lab up afterwards"),
) -> None:
    """p50/p99/max of stop, snapshot and cont per method (librbd vs QMP transaction)."""
    from pathlib import Path

    from cutpoint.bench import agent as bench_agent
    from cutpoint.lab.errors import LabError

    Path(json_out).parent.mkdir(parents=True, exist_ok=True)
    try:
        bench_agent.run(rounds=rounds, json_out=json_out, keep_lab=keep_lab, log=_log)
    except LabError as exc:
        typer.echo(f"cutpoint agent bench: error: {exc}", err=True)
        raise typer.Exit(2) from exc
