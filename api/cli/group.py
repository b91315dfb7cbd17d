"""`cutpoint group …`: consistency groups, their policy and their snapshots."""

from __future__ import annotations

from typing import Any

import typer
from cutpoint.api.cli.apiclient import Api, JsonOpt, TokenOpt, UrlOpt, print_json, run
from cutpoint.api.cli.confirm import confirm_or_exit
from cutpoint.api.cli.job import watch_job
from cutpoint.api.cli.output import Console, Table

app = typer.Typer(help="Consistency groups (over the API).", no_args_is_help=True)


def _policy_body(rpo: int | None, keep_last: int | None, keep_within: int | None,
                 budget_ms: int | None, lease_ms: int | None, target: str | None,
                 quiesce: str | None) -> dict[str, Any]:
    body = {"rpo_seconds": rpo, "keep_last": keep_last, "keep_within": keep_within,
            "pause_budget_ms": budget_ms, "lease_ms": lease_ms, "replication_target": target,
            "quiesce": quiesce}
    return {k: v for k, v in body.items() if v is not None}


RpoOpt = typer.Option(None, "--rpo", min=1, help="target RPO in seconds (enables the schedule)")
KeepLastOpt = typer.Option(None, "--keep-last", min=1)
KeepWithinOpt = typer.Option(None, "--keep-within", min=0, help="seconds")
BudgetOpt = typer.Option(None, "--pause-budget-ms", min=1)
LeaseOpt = typer.Option(None, "--lease-ms", min=100)
TargetOpt = typer.Option(None, "--replication-target", help="site name")
QuiesceOpt = typer.Option(None, "--quiesce", help="crash or fs-freeze")


@app.command("create")
def create(name: str, description: str = "", rpo: int | None = RpoOpt,
           keep_last: int | None = KeepLastOpt, keep_within: int | None = KeepWithinOpt,
           budget_ms: int | None = BudgetOpt, lease_ms: int | None = LeaseOpt,
           target: str | None = TargetOpt, quiesce: str | None = QuiesceOpt,
           url: str = UrlOpt, token: str = TokenOpt, json_out: bool = JsonOpt) -> None:
    """Create a group (optionally with its policy)."""
    body: dict[str, Any] = {"name": name, "description": description}
    pol = _policy_body(rpo, keep_last, keep_within, budget_ms, lease_ms, target, quiesce)
    if pol:
        body["policy"] = pol
    g = run(lambda: Api(url, token).post("/v1/groups", json=body))
    print_json(g) if json_out else typer.echo(f"group {g['name']} id={g['id']}")


@app.command("enable")
def enable(name: str, url: str = UrlOpt, token: str = TokenOpt,
           json_out: bool = JsonOpt) -> None:
    """Turn the group's snapshot schedule back on (a failover turns it off)."""
    g = run(lambda: Api(url, token).patch(f"/v1/groups/{name}", json={"enabled": True}))
    print_json(g) if json_out else typer.echo(f"group {g['name']}: schedule enabled")


@app.command("disable")
def disable(name: str, url: str = UrlOpt, token: str = TokenOpt,
            json_out: bool = JsonOpt) -> None:
    """Stop the group's scheduled snapshots (manual ones still run)."""
    g = run(lambda: Api(url, token).patch(f"/v1/groups/{name}", json={"enabled": False}))
    print_json(g) if json_out else typer.echo(f"group {g['name']}: schedule disabled")


@app.command("delete")
def delete(name: str, yes: bool = typer.Option(False, "--yes", help="do not ask for confirmation"),
           url: str = UrlOpt, token: str = TokenOpt) -> None:
    """Delete the group and its records (refused while a snapshot is in flight).

    Its VMs keep running and its member snapshots stay on the disks: only the
    control plane forgets them.  Asks first unless --yes."""
    api = Api(url, token)
    g = run(lambda: api.get(f"/v1/groups/{name}"))
    confirm_or_exit("group delete",
                    f"Delete group {g['name']} ({len(g.get('members') or [])} member(s))? "
                    "Its recovery points are forgotten; the VMs and the RBD snapshots stay.",
                    yes)
    run(lambda: api.call("DELETE", f"/v1/groups/{name}"))
    typer.echo(f"group {g['name']} deleted")


@app.command("list")
def list_(url: str = UrlOpt, token: str = TokenOpt, json_out: bool = JsonOpt) -> None:
    """List groups."""
    items = run(lambda: Api(url, token).all("/v1/groups"))
    if json_out:
        print_json(items)
        return
    t = Table("id", "name", "members", "disks", "rpo s", "keep last", "enabled")
    for g in items:
        t.add_row(str(g["id"]), g["name"], str(len(g["members"])),
                  str(sum(len(m["disks"]) for m in g["members"])),
                  str(g["policy"]["rpo_seconds"] or "-"), str(g["policy"]["keep_last"]),
                  "yes" if g["enabled"] else "no")
    Console().print(t)


@app.command("show")
def show(name: str, url: str = UrlOpt, token: str = TokenOpt, json_out: bool = JsonOpt) -> None:
    """Show a group: members, disks and policy."""
    g = run(lambda: Api(url, token).get(f"/v1/groups/{name}"))
    if json_out:
        print_json(g)
        return
    c = Console()
    c.print(f"[bold]{g['name']}[/bold] (id {g['id']}) {g['description']}")
    c.print("policy: " + ", ".join(f"{k}={v}" for k, v in g["policy"].items()))
    t = Table("member", "kind", "host", "vm", "disks")
    for m in g["members"]:
        t.add_row(str(m["id"]), m["kind"], m["host"], m["vm"], " ".join(m["disks"]))
    c.print(t)


@app.command("add-vm")
def add_vm(group: str, vm: str, host: str | None = typer.Option(None, "--host"),
           url: str = UrlOpt, token: str = TokenOpt, json_out: bool = JsonOpt) -> None:
    """Add a VM (all of its disks) to a group."""
    body = {"vm": vm, **({"host": host} if host else {})}
    m = run(lambda: Api(url, token).post(f"/v1/groups/{group}/members", json=body))
    print_json(m) if json_out else typer.echo(f"added {m['vm']}: {' '.join(m['disks'])}")


@app.command("add-disk")
def add_disk(group: str, disk: str = typer.Argument(..., help="<vm>/<node>"),
             host: str | None = typer.Option(None, "--host"),
             url: str = UrlOpt, token: str = TokenOpt, json_out: bool = JsonOpt) -> None:
    """Add a single disk to a group."""
    body = {"disk": disk, **({"host": host} if host else {})}
    m = run(lambda: Api(url, token).post(f"/v1/groups/{group}/members", json=body))
    print_json(m) if json_out else typer.echo(f"added {' '.join(m['disks'])}")


@app.command("policy")
def policy(group: str, rpo: int | None = RpoOpt, keep_last: int | None = KeepLastOpt,
           keep_within: int | None = KeepWithinOpt, budget_ms: int | None = BudgetOpt,
           lease_ms: int | None = LeaseOpt, target: str | None = TargetOpt,
           quiesce: str | None = QuiesceOpt,
           no_schedule: bool = typer.Option(False, "--no-schedule", help="clear the RPO"),
           drill_every: int | None = typer.Option(
               None, "--drill-every", min=60,
               help="run a drill of the newest DR recovery point this often (seconds; "
                    "604800 is weekly)"),
           no_drills: bool = typer.Option(False, "--no-drill-schedule",
                                          help="clear the drill schedule"),
           url: str = UrlOpt, token: str = TokenOpt, json_out: bool = JsonOpt) -> None:
    """Show a group's policy, or change the fields given."""
    api = Api(url, token)
    body = _policy_body(rpo, keep_last, keep_within, budget_ms, lease_ms, target, quiesce)
    if no_schedule:
        body["clear_rpo"] = True
    if drill_every is not None:
        body["drill_every"] = drill_every
    if no_drills:
        body["clear_drill"] = True
    if body:
        etag = run(lambda: api.http.get(f"/v1/groups/{group}/policy")).headers.get("ETag")
        p = run(lambda: api.patch(f"/v1/groups/{group}/policy", json=body,
                                  headers={"If-Match": etag} if etag else {}))
    else:
        p = run(lambda: api.get(f"/v1/groups/{group}/policy"))
    if json_out:
        print_json(p)
    else:
        for k, v in p.items():
            typer.echo(f"{k:20} {v}")


@app.command("snapshot")
def snapshot(group: str, wait: bool = typer.Option(True, "--wait/--no-wait"),
             url: str = UrlOpt, token: str = TokenOpt, json_out: bool = JsonOpt) -> None:
    """Take a group snapshot now, with live progress until it ends."""
    api = Api(url, token)
    job = run(lambda: api.post(f"/v1/groups/{group}/snapshots"))
    if wait:
        job = watch_job(api, job["id"], quiet=json_out)
    snap = run(lambda: api.get(f"/v1/snapshots/{job['snapshot_id']}")) \
        if job.get("snapshot_id") else None
    if json_out:
        print_json({"job": job, "snapshot": snap})
    elif snap is not None:
        _print_snapshot(snap)
    if wait and job["state"] != "succeeded":
        raise typer.Exit(1)


def _print_snapshot(s: dict[str, Any]) -> None:
    c = Console()
    c.print(f"snapshot {s['id']} txn={s['txn']} state=[bold]{s['state']}[/bold] "
            f"max pause={_ms(s['max_pause_ms'])} duration={_ms(s['duration_ms'])}"
            + (f" error={s['error_code']}" if s["error_code"] else ""))
    if s["state"] == "aborting":
        c.print("[bold yellow]aborting: the cleanup is not confirmed, a member snapshot of "
                "this txn may remain; the worker retries the abort (when it starts and every "
                "resolve_interval_s)[/bold yellow]")
    if s.get("members"):
        t = Table("host", "vm", "disk", "name", "state", "paused", "snapshot")
        for m in s["members"]:
            t.add_row(m["host"], m["vm"], m["disk"], m["name"], m["state"],
                      _ms(m["paused_ms"]), _ms(m["snapshot_ms"]))
        c.print(t)


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f} ms"


@app.command("snapshots")
def snapshots(group: str, limit: int = typer.Option(20, min=1, max=500),
              url: str = UrlOpt, token: str = TokenOpt, json_out: bool = JsonOpt) -> None:
    """List a group's snapshots, newest first."""
    items = run(lambda: Api(url, token).get(f"/v1/groups/{group}/snapshots",
                                            params={"limit": limit}))["items"]
    if json_out:
        print_json(items)
        return
    t = Table("id", "txn", "state", "trigger", "cut at", "max pause", "duration", "error")
    for s in items:
        t.add_row(str(s["id"]), s["txn"], s["state"], s["trigger"], s["cut_at"] or "-",
                  _ms(s["max_pause_ms"]), _ms(s["duration_ms"]), s["error_code"] or "")
    Console().print(t)


@app.command("snapshot-show")
def snapshot_show(snapshot_id: int, url: str = UrlOpt, token: str = TokenOpt,
                  json_out: bool = JsonOpt) -> None:
    """Show one group snapshot with its member snapshots."""
    s = run(lambda: Api(url, token).get(f"/v1/snapshots/{snapshot_id}"))
    print_json(s) if json_out else _print_snapshot(s)


@app.command("retention")
def retention(group: str, url: str = UrlOpt, token: str = TokenOpt,
              json_out: bool = JsonOpt) -> None:
    """Apply the retention policy now and wait for it."""
    api = Api(url, token)
    job = watch_job(api, run(lambda: api.post(f"/v1/groups/{group}/retention"))["id"],
                    quiet=json_out)
    print_json(job) if json_out else typer.echo(f"retention: {job['result']}")
    if job["state"] != "succeeded":
        raise typer.Exit(1)
