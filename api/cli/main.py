"""The `cutpoint` command: one Typer app, one sub-app per concern.

Each sub-app lives in its own module next to this one and is registered
below; keep this file a table of contents.  These are the operator's
commands.
"""

from __future__ import annotations

import typer
from cutpoint.api.cli import (
    drill,
    group,
    inventory,
    job,
    orphans,
    restore,
    rpo,
    server,
    site,
    token,
    vm,
    webhook,
)
from cutpoint.api.cli.snapshot import snapshot as snapshot_cmd
from cutpoint.api.version import VERSION

app = typer.Typer(
    name="cutpoint",
    help="Crash-consistent group snapshots and DR for QEMU/KVM.",
    no_args_is_help=True,
    add_completion=True,
)
app.add_typer(server.app, name="server")
app.add_typer(token.app, name="token")
app.add_typer(group.app, name="group")
app.add_typer(job.app, name="job")
app.add_typer(rpo.app, name="rpo")
app.add_typer(orphans.app, name="orphans")
app.add_typer(site.app, name="site")
app.add_typer(restore.app, name="restore")
app.add_typer(inventory.host_app, name="host")
app.add_typer(vm.app, name="vm")
app.add_typer(webhook.app, name="webhook")
app.command("snapshot")(snapshot_cmd)
app.add_typer(drill.app, name="drill"); app.add_typer(drill.dr_app, name="dr")
app.add_typer(drill.plan_app, name="plan")


def _version(value: bool) -> None:
    if value:
        typer.echo(f"cutpoint {VERSION}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True,
        help="Print the version and exit.",
    ),
) -> None:
    """cutpoint: snapshots of VM groups, replicated and drilled."""


def main() -> None:
    app()
