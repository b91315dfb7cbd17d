"""The `cutpoint-lab` command: the test bed's, beside the operator's `cutpoint`.

One Typer app, one sub-app or command per concern, each in its own module
next to this one; keep this file a table of contents.

    cutpoint-lab up | status | down | group-file | build-image   the lab
    cutpoint-lab bench ...       every benchmark (print a table, write JSON)
    cutpoint-lab check ...       the workload checkers
    cutpoint-lab demo            the control-plane demo of `make demo`
    cutpoint-lab dr-walkthrough  docs/dr.md's DR walkthrough, every step run
"""

from __future__ import annotations

import typer
from cutpoint.api.version import VERSION
from cutpoint.lab import demo, walkthrough
from cutpoint.lab.cli import bench, check, lab

app = typer.Typer(
    name="cutpoint-lab",
    help="The cutpoint test bed: the lab, benchmarks, workload checkers, the demo.",
    no_args_is_help=True,
    add_completion=False,
)
lab.register(app)
app.add_typer(bench.app, name="bench")
app.add_typer(check.app, name="check")
app.command("demo")(demo.demo)
app.command("dr-walkthrough")(walkthrough.walkthrough)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"cutpoint-lab {VERSION}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True,
        help="Print the version and exit.",
    ),
) -> None:
    """cutpoint-lab: the test bed of cutpoint (two Ceph sites, host namespaces, QEMU guests)."""


def main() -> None:
    app()
