"""`cutpoint snapshot --group-file G`: crash-consistent group snapshots.

    cutpoint snapshot --group-file G                    one group snapshot
    cutpoint snapshot --group-file G --every 5s --count N
    cutpoint snapshot --group-file G --resolve-only     resolve in-doubt txns

The group file format is described in cutpoint.coordinator.groupfile.
Exit status: 0 every snapshot committed, 1 some snapshot aborted, 2 bad
input, 3 the transaction log is unavailable (nothing was paused).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Annotated

import typer
from cutpoint.api.cli.output import Console, Table
from cutpoint.coordinator import (
    CoordinatorError,
    GroupFileError,
    GroupSnapshotResult,
    SpecError,
    TxLog,
    TxLogError,
    load_group_file,
    pool_for,
    resolve_in_doubt,
    take_group_snapshot,
)

DEFAULT_DB_DIR = "/var/lib/cutpoint"
_DUR = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h)?$")


def default_db_url() -> str:
    url = os.environ.get("CUTPOINT_COORDINATOR_DB")
    if url:
        return url
    d = Path(os.environ.get("CUTPOINT_STATE_DIR", DEFAULT_DB_DIR))
    return f"sqlite:///{d / 'coordinator.db'}"


def parse_duration(text: str) -> float:
    """'5s', '500ms', '2m', '1h', or bare seconds → seconds."""
    m = _DUR.match(text.strip())
    if not m:
        raise typer.BadParameter(f"{text!r}: expected a duration like 5s, 500ms, 2m")
    scale = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, None: 1}[m.group(2)]
    value = float(m.group(1)) * scale
    if value <= 0:
        raise typer.BadParameter(f"{text!r}: must be positive")
    return value


def _error(msg: str) -> None:
    # Plain text: error lines must not be wrapped or styled.
    typer.echo(msg, err=True)


def _f(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def print_result(console: Console, r: GroupSnapshotResult) -> None:
    colour = "green" if r.committed else "red"
    title = f"group {r.group} txn {r.txn}: [{colour}]{r.state.upper()}[/{colour}]"
    if r.from_log:
        title += " (from the log)"
    table = Table(title=title, title_justify="left")
    left = ("vm", "agent", "method", "consistency")
    for col in (*left, "freeze ms", "stop ms", "barrier ms", "backend ms",
                "cont ms", "pause ms", "overhead ms"):
        table.add_column(col, justify="left" if col in left else "right")
    for v in r.vms:
        table.add_row(v.vm, v.agent, v.method or "-", v.consistency or "-", _f(v.freeze_ms),
                      _f(v.stop_ms), _f(v.barrier_ms), _f(v.snapshot_ms), _f(v.cont_ms),
                      _f(v.paused_ms), _f(v.overhead_ms))
    t = r.timings
    table.add_row("[b]group[/b]", "", "", "", "", "", _f(t.get("barrier_max_ms")),
                  _f(t.get("snapshot_max_ms")), "", _f(t.get("pause_max_ms")),
                  _f(t.get("overhead_max_ms")), end_section=True)
    console.print(table)
    console.print(f"total {_f(t.get('total_ms'))} ms  (prepare {_f(t.get('prepare_ms'))}, "
                  f"log {_f(t.get('log_commit_ms'))}, commit {_f(t.get('commit_ms'))}, "
                  f"verify {_f(t.get('verify_ms'))})  "
                  f"member snapshots: {len(r.snapshots)}")
    if r.reason:
        console.print(f"reason: {r.reason}")
    for v in r.vms:
        if v.freeze_error:       # asked for fs-freeze, fell back to crash
            console.print(f"{v.vm}: fs-freeze fell back to crash: {v.freeze_error}")
        if v.pause_path_why and v.pause_path == "redirect":   # could be cut live
            console.print(f"{v.vm}: stopped for its switch: {v.pause_path_why}")
        elif v.pause_path_why:   # could take the redirect cut; paused for the backend
            console.print(f"{v.vm}: cut inside the pause: {v.pause_path_why}")
        if v.thaw_error:         # the snapshot stands; the guest may be frozen
            console.print(f"[bold red]{v.vm}: thaw failed, the guest may still be frozen "
                          f"(writes blocked): {v.thaw_error}[/bold red]")


def snapshot(
    group_file: Annotated[Path, typer.Option("--group-file", "-g",
                                             help="group definition (YAML)")],
    every: Annotated[str | None, typer.Option(
        "--every", help="repeat at this interval, e.g. 5s")] = None,
    count: Annotated[int | None, typer.Option(
        "--count", "-n", min=1,
        help="number of snapshots (default 1; unbounded with --every)")] = None,
    db: Annotated[str | None, typer.Option(
        "--db", help="transaction log URL (SQLAlchemy); default $CUTPOINT_COORDINATOR_DB "
        "or sqlite:///var/lib/cutpoint/coordinator.db")] = None,
    txn: Annotated[str | None, typer.Option(
        "--txn", help="transaction id (repeat one idempotently)")] = None,
    resolve_only: Annotated[bool, typer.Option(
        "--resolve-only", help="only resolve in-doubt transactions of the group")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="one JSON object per snapshot")] = False,
) -> None:
    """Take crash-consistent snapshots of a group of VMs (two-phase commit)."""
    # Wide enough for the table when the output is a pipe or a log file.
    console = Console(width=None if sys.stdout.isatty() else 132)
    interval = parse_duration(every) if every else None
    n = count if count is not None else (None if interval else 1)
    if txn and (interval or (n or 1) > 1):
        raise typer.BadParameter("--txn names one snapshot; it cannot be combined with "
                                 "--every/--count")
    try:
        spec = load_group_file(group_file)
    except GroupFileError as exc:
        _error(f"cutpoint snapshot: error: {exc}")
        raise typer.Exit(2) from None
    url = db or default_db_url()
    if url.startswith("sqlite:///") and not db:
        Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)

    def emit(r: GroupSnapshotResult) -> None:
        if json_out:
            console.print_json(json.dumps(r.to_dict()), indent=None)
        else:
            print_result(console, r)

    async def run() -> int:
        txlog = TxLog(url)
        pool = pool_for(spec)
        failed = 0
        try:
            resolved = await resolve_in_doubt(txlog, pool, group=spec.name,
                                              wait=resolve_only)
            for r in resolved:
                if not json_out:
                    console.print(f"resolved in-doubt txn {r.txn}: {r.state}")
                emit(r)
            if resolve_only:
                return 0 if all(r.state in ("committed", "aborted") for r in resolved) else 1
            i = 0
            while n is None or i < n:
                t0 = time.monotonic()
                r = await take_group_snapshot(spec, txlog, txn=txn, pool=pool)
                emit(r)
                failed += not r.committed
                i += 1
                if interval and (n is None or i < n):
                    await asyncio.sleep(max(0.0, interval - (time.monotonic() - t0)))
            return 1 if failed else 0
        finally:
            await pool.close()
            txlog.dispose()

    try:
        rc = asyncio.run(run())
    except TxLogError as exc:
        op = exc.operation.split()[0]
        if op in ("begin", "create", "read", "list"):
            what = "nothing was paused"
        elif op == "committed":
            what = ("the member snapshots exist but COMMITTED is not recorded; "
                    "`--resolve-only` finishes the txn")
        else:
            what = "the group was aborted and its VMs resumed (presumed abort)"
        _error(f"cutpoint snapshot: error: {exc}; {what}")
        raise typer.Exit(3) from None
    except (CoordinatorError, SpecError) as exc:
        _error(f"cutpoint snapshot: error: {exc}")
        raise typer.Exit(2) from None
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    raise typer.Exit(rc)

