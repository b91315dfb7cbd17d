"""`cutpoint orphans sweep`: find, and with the operator's consent delete,
the member snapshots that an abort or a crash left behind.

    cutpoint orphans sweep --dry-run        what would go, and why the rest stays
    cutpoint orphans sweep --yes            delete them (a job; audit-logged)

Admin only.  The same sweep runs at worker start and every
`orphan_sweep_interval_s`; this is for an operator who wants it now, or
wants to see it first.  Exit status: 0 done (or nothing to do), 1 an API
error or a sweep that left something (failed, unreachable), 2 not
confirmed.
"""

from __future__ import annotations

import time
from typing import Any

import typer
from cutpoint.api.cli.apiclient import Api, JsonOpt, TokenOpt, UrlOpt, print_json, run
from cutpoint.api.cli.confirm import confirm_or_exit
from cutpoint.api.cli.job import watch_job
from cutpoint.api.cli.output import Console, Table
from cutpoint.api.cli.snapshot import parse_duration

app = typer.Typer(help="Orphan member snapshots (left by an abort or a crash).",
                  no_args_is_help=True)


def _age(created: int | None) -> str:
    if created is None:
        return "?"
    s = max(0, int(time.time()) - created)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def print_plan(console: Console, plan: dict[str, Any], show_all: bool) -> None:
    rows = [v for v in plan["verdicts"] if show_all or v["action"] == "delete"]
    t = Table("host", "disk", "snapshot", "id", "owner txn", "age", "action", "why",
              title=f"{plan['orphans']} orphan(s) among {plan['snapshots']} snapshot(s) on "
                    f"{plan['disks']} disk(s) of {plan['hosts']} host(s); "
                    f"grace {plan['grace_s']:.0f} s", title_justify="left")
    for v in rows:
        t.add_row(v["host"], v["disk"], v["name"], str(v["id"] if v["id"] is not None else "-"),
                  v["owner"] or "-", _age(v["created"]),
                  "[red]delete[/red]" if v["action"] == "delete" else "keep",
                  f"{v['reason']}: {v['detail']}")
    console.print(t)
    if plan["kept"]:
        console.print("kept: " + ", ".join(f"{k} {n}" for k, n in sorted(plan["kept"].items())))
    for line in plan["unreachable"]:
        console.print(f"[yellow]unreachable[/yellow] {line}")
    for line in plan["list_errors"]:
        console.print(f"[yellow]not listed[/yellow] {line}")


@app.command("sweep")
def sweep(url: str = UrlOpt, token: str = TokenOpt, json_out: bool = JsonOpt,
          dry_run: bool = typer.Option(False, "--dry-run",
                                       help="only show what would be deleted, and why"),
          yes: bool = typer.Option(False, "--yes", help="delete without asking"),
          grace: str | None = typer.Option(
              None, help="minimum age of an orphan (e.g. 30m, 2h); default: the server's "
                         "orphan_grace_s"),
          show_all: bool = typer.Option(False, "--all", help="list the kept snapshots too")) \
        -> None:
    """Delete member snapshots of transactions that ended without a recovery point."""
    api = Api(url, token)
    console = Console()
    grace_s = parse_duration(grace) if grace else None
    params = {} if grace_s is None else {"grace_s": grace_s}
    plan = run(lambda: api.get("/v1/orphans", params=params, timeout=300))
    if json_out and dry_run:
        print_json(plan)
        return
    if not json_out:
        print_plan(console, plan, show_all or dry_run)
    if dry_run:
        return
    if plan["orphans"] == 0:
        if json_out:
            print_json(plan)
        else:
            console.print("nothing to delete")
        return
    confirm_or_exit("orphans sweep", f"Delete {plan['orphans']} orphan snapshot(s)?", yes)
    job = run(lambda: api.post("/v1/orphans/sweep", json=params))
    done = watch_job(api, job["id"], quiet=json_out)
    res = done.get("result") or {}
    if json_out:
        print_json(done)
    else:
        # The job decides again when it runs: it may find a different set.
        console.print(f"deleted {len(res.get('deleted', []))}, gone already "
                      f"{len(res.get('absent', []))}, refused (changed since listed) "
                      f"{len(res.get('refused', []))}, failed {len(res.get('failed', []))}; "
                      f"job {done['id']} (audit log: path agent:HOST/DISK@SNAPSHOT)")
        for row in res.get("failed", []) + res.get("refused", []):
            console.print(f"[red]{row['host']} {row['disk']}@{row['name']}[/red]: "
                          f"{row.get('error', '')}")
    if done["state"] != "succeeded":
        raise typer.Exit(1)
