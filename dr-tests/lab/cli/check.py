"""`cutpoint-lab check ...`: recovery checkers for the guest workloads.

    cutpoint-lab check writer --images primary:rbd/vm1-disk0@snap ... [--json]
    cutpoint-lab check writer --files disk0.raw disk1.raw ...
    cutpoint-lab check writer --group-snapshot TXN [--db URL]

Exit status: 0 when the records are exactly 1..p, 1 when they are not
(gaps, torn, corrupt or duplicate records), 2 when the input cannot be read.
"""

from __future__ import annotations

import json
from typing import Annotated

import typer
from cutpoint.checkers import writer as wr

app = typer.Typer(help="Check recovered workload data.", no_args_is_help=True)


@app.callback()
def _check() -> None:
    """Check recovered workload data (one sub-command per workload)."""


def _group_specs(txn: str, db: str | None) -> list[wr.Spec]:
    """Member snapshots of a committed group snapshot (transaction log of
    the coordinator; disks mapped to images through the lab status)."""
    from cutpoint.api.cli.snapshot import default_db_url
    from cutpoint.lab.status import load_status
    try:
        status = load_status()
    except Exception as e:  # surfaced to the user as is
        raise ValueError(f"--group-snapshot maps disks through the lab: {e}") from e
    return wr.specs_for_group_snapshot(txn, db or default_db_url(), status)


@app.command("writer")
def writer(
    sources: Annotated[list[str] | None, typer.Argument(
        help="Images (with --images) or files (with --files).")] = None,
    images: Annotated[bool, typer.Option(
        "--images",
        help="SOURCES are images: [SITE:|CONF:]POOL/IMAGE[@SNAP] or "
             "[qcow2:]PATH.qcow2[@SNAP].")] = False,
    files: Annotated[bool, typer.Option(
        "--files", help="SOURCES are raw files.")] = False,
    group_snapshot: Annotated[str | None, typer.Option(
        "--group-snapshot", help="Check every member of this group "
        "snapshot (transaction id).")] = None,
    conf: Annotated[str | None, typer.Option(
        "--conf", help="ceph.conf for POOL/IMAGE forms (default: the "
        "lab's site).")] = None,
    client_id: Annotated[str, typer.Option(
        "--id", help="Ceph client id.")] = "admin",
    keyring: Annotated[str | None, typer.Option(
        "--keyring", help="Ceph keyring.")] = None,
    db: Annotated[str | None, typer.Option(
        "--db", help="coordinator transaction log URL for --group-snapshot "
        "(default: that of `cutpoint snapshot`).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Prove the writer's records on every disk are exactly 1..p."""
    sources = sources or []
    modes = sum([images, files, group_snapshot is not None])
    try:
        if modes != 1:
            raise ValueError("give exactly one of --images, --files, "
                             "--group-snapshot")
        if group_snapshot is not None:
            if sources:
                raise ValueError("--group-snapshot takes no other arguments")
            specs = _group_specs(group_snapshot, db)
        elif not sources:
            raise ValueError("no images or files given")
        elif files:
            specs = [wr.FileSpec(s) for s in sources]
        else:
            specs = [wr.parse_image(s, conf=conf, client_id=client_id,
                                    keyring=keyring) for s in sources]
        verdict = wr.scan_specs(specs)
    except (ValueError, wr.CheckerError) as e:
        if as_json:
            typer.echo(json.dumps({"ok": False, "error": str(e)}))
        else:
            typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    if as_json:
        typer.echo(json.dumps(verdict.as_dict(), indent=2))
    else:
        typer.echo(verdict.summary())
        for a in verdict.anomalies:
            where = a.source + (f" @ {a.offset}" if a.offset is not None else "")
            typer.echo(f"  {a.kind}: {where}: {a.detail}")
    raise typer.Exit(0 if verdict.ok else 1)


from cutpoint.lab.cli import check_stores  # noqa: F401  (kvstore, sharedlog)
