"""`cutpoint-lab check kvstore` and `cutpoint-lab check sharedlog`.

Both read the raw disks of every node of a store (files or block
devices: restored clones exported with `rbd export`, or `/dev/rbdN`),
and optionally ask the running store (live, after it came up again).

Exit status: 0 when every invariant holds, 1 when one fails, 2 when the
input cannot be read.  These commands hang off the `check` app of
`check.py`, which imports this module.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from cutpoint.lab.cli.check import app


def _finish(d: dict[str, Any], as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(d, indent=2))
    else:
        typer.echo(f"{'OK' if d['ok'] else 'FAILED'}  "
                   + "  ".join(f"{k}={v}" for k, v in d["stats"].items()))
        for name, c in d["checks"].items():
            mark = "ok  " if c["ok"] else "FAIL"
            typer.echo(f"  {mark} {name}"
                       + ("" if c["ok"] else f" ({c['violations']} violations)"))
            for ex in c["examples"][:5]:
                typer.echo(f"         {ex}")
    raise typer.Exit(0 if d["ok"] else 1)


def _error(e: Exception, as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps({"ok": False, "error": str(e)}))
    else:
        typer.echo(f"error: {e}", err=True)
    raise typer.Exit(2)


@app.command("kvstore")
def kvstore(
    disks: Annotated[list[str] | None, typer.Argument(
        help="Raw disk of every node (files or block devices).")] = None,
    live: Annotated[str | None, typer.Option(
        "--live", help="Also ask the running servers: comma-separated "
        "IP:PORT of every node in ring order.")] = None,
    partitions: Annotated[int, typer.Option(
        "--partitions", help="Partitions (live only, without disks).")] = 8,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Check a cp-kvstore (ZHT) after recovery."""
    from cutpoint.checkers import kvstore as kv
    try:
        verdict = kv.check_disks(disks) if disks else None
        if live:
            peers = [p.strip() for p in live.split(",") if p.strip()]
            nparts = partitions
            if verdict is not None:
                nparts = int(verdict.stats["partitions"])
            verdict = kv.check_live(peers, nparts, verdict)
        if verdict is None:
            raise kv.KvCheckError("give disks, --live, or both")
    except (kv.KvCheckError, OSError) as e:
        _error(e, as_json)
        return
    _finish(verdict.as_dict(), as_json)


@app.command("sharedlog")
def sharedlog(
    disks: Annotated[list[str] | None, typer.Argument(
        help="Raw disk of every node (files or block devices).")] = None,
    live: Annotated[str | None, typer.Option(
        "--live", help="Also subscribe to the running log: comma-separated "
        "IP:PORT of every storage server in ring order.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Check a cp-sharedlog (Scalog) after recovery."""
    from cutpoint.checkers import sharedlog as sl
    try:
        if not disks:
            raise sl.LogCheckError("give the disks of every node")
        verdict = sl.check_disks(disks, live=live)
    except (sl.LogCheckError, OSError) as e:
        _error(e, as_json)
        return
    _finish(verdict.as_dict(), as_json)
