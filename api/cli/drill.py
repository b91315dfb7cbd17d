"""`cutpoint drill run|list GROUP`, `cutpoint drill show JOB`, `cutpoint plan show|set|versions GROUP`,
`cutpoint dr status GROUP`, `cutpoint dr replicate SNAPSHOT`,
`cutpoint dr failover GROUP`, `cutpoint dr re-protect GROUP`, `cutpoint dr failback GROUP`:
disaster recovery through the API."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from cutpoint.api.cli.apiclient import Api, JsonOpt, TokenOpt, UrlOpt, print_json, run
from cutpoint.api.cli.confirm import confirm_or_exit
from cutpoint.api.cli.job import watch_job
from cutpoint.api.cli.output import Console, Table

app = typer.Typer(help="Drills (test failover) at the DR site.", no_args_is_help=True)
CheckOpt = typer.Option([], "--check", help="check to run (repeatable; default: the "
                        "checks of the plan, else writer); with parameters, give them "
                        "in the plan's drill_checks")
PlanFileOpt = typer.Option(None, "--plan", exists=True, dir_okay=False,
                           help="a recovery plan (JSON or YAML) for this drill only; "
                           "default the group's")
PlanFileArg = typer.Argument(..., exists=True, dir_okay=False, help="the plan, JSON or YAML")
plan_app = typer.Typer(help="Recovery plans: boot order, readiness, hooks, networks.",
                       no_args_is_help=True)


def read_plan(path: Path) -> dict[str, Any]:
    """A plan file: JSON, or YAML (.yaml/.yml)."""
    text = path.read_text()
    if path.suffix in (".yaml", ".yml"):
        import yaml

        body = yaml.safe_load(text)
    else:
        body = json.loads(text)
    if not isinstance(body, dict):
        raise typer.BadParameter(f"{path}: a plan is an object")
    return body
dr_app = typer.Typer(help="Replication state, replication and failover.", no_args_is_help=True)


def _print_report(r: dict[str, Any]) -> None:
    c = Console()
    color = "green" if r.get("verdict") == "passed" else "red"
    c.print(f"drill {r.get('drill_id')}: [{color}]{str(r.get('verdict')).upper()}[/{color}]"
            f" recovery point {r.get('recovery_point')}")
    t = Table("t (s)", "step", "status", "detail")
    for ev in r.get("timeline", []):
        detail = ev.get("vm") or ev.get("check") or ev.get("summary") or ev.get("error") or ""
        t.add_row(f"{ev['t_s']:.1f}", ev["step"], ev["status"], str(detail)[:100])
    c.print(t)
    for b in r.get("boot_order") or []:
        c.print(f"boot group {b.get('order')} {b.get('group')}: {', '.join(b.get('vms') or [])}"
                f" ready at {b.get('ready_t_s')} s")
    for chk in r.get("checks", []):
        c.print(f"check {chk['name']}: {'pass' if chk['ok'] else 'FAIL'}: {chk['summary']}")
    c.print(f"report: {r.get('report_html')}  (JSON {r.get('report_json')})")


@app.command("run")
def drill_run(group: str,
              recovery_point: str = typer.Option("latest", "--point", "--recovery-point",
                                                 help="snapshot id, txn or latest"),
              check: list[str] = CheckOpt,
              plan: Path | None = PlanFileOpt,
              url: str = UrlOpt, token: str = TokenOpt, json_out: bool = JsonOpt,
              timeout: float = typer.Option(900, help="give up following after this")) -> None:
    """Start a drill and follow it live; exit status 1 unless it passed."""
    api = Api(url, token)
    body: dict[str, Any] = {"recovery_point": recovery_point}
    if check:
        body["checks"] = check
    if plan is not None:
        body["plan"] = read_plan(plan)
    job = run(lambda: api.post(f"/v1/groups/{group}/drills", json=body))
    job = watch_job(api, job["id"], quiet=json_out, timeout=timeout, poll=0.5)
    report = job.get("result") or {}
    if json_out:
        print_json(job)
    elif report:
        _print_report(report)
    if job["state"] != "succeeded":
        raise typer.Exit(1)


@plan_app.command("show")
def plan_show(group: str, version: int | None = typer.Option(None, min=1),
              url: str = UrlOpt, token: str = TokenOpt, json_out: bool = JsonOpt) -> None:
    """The group's recovery plan (newest, or --version N): boot groups in order."""
    p = run(lambda: Api(url, token).get(f"/v1/groups/{group}/plan",
                                        params={"version": version} if version else None))
    if json_out:
        print_json(p)
        return
    c = Console()
    c.print(f"plan of {p['group']}: version {p['version']} by {p['created_by'] or '-'} "
            f"at {p['created_at']}")
    body = p["body"]
    t = Table("order", "boot group", "vm", "readiness", "delay s", "hooks")
    for n, g in enumerate(body.get("boot_groups") or [], 1):
        hooks = ", ".join(f"{k}: {h.get('path')}" for k in ("pre", "post")
                          for h in g.get(k) or [])
        for v in g["vms"]:
            v = {"vm": v} if isinstance(v, str) else v
            r = v.get("readiness") or {}
            rule = r.get("kind", "guest-ping") + (f" {r.get('address')}:{r.get('port')}"
                                                  if r.get("kind") == "tcp" else "")
            t.add_row(str(n), str(g.get("name") or f"group-{n}"), v["vm"], rule,
                      str(v.get("delay_s", "")), hooks)
            hooks = ""
    c.print(t)
    nets = body.get("networks") or {}
    c.print(f"networks: failover {nets.get('failover') or '(the site map)'}; "
            f"drill {nets.get('drill') or '(the site drill_network)'}")
    for chk in body.get("drill_checks") or []:
        c.print(f"drill check: {chk if isinstance(chk, str) else chk.get('name')} "
                f"{'' if isinstance(chk, str) else json.dumps(chk.get('params') or {})}")


@plan_app.command("set")
def plan_set(group: str, file: Path = PlanFileArg,
             url: str = UrlOpt, token: str = TokenOpt, json_out: bool = JsonOpt) -> None:
    """Store FILE (JSON or YAML) as the group's recovery plan: a new version."""
    p = run(lambda: Api(url, token).put(f"/v1/groups/{group}/plan", json=read_plan(file)))
    if json_out:
        print_json(p)
    else:
        Console().print(f"plan of {p['group']}: version {p['version']} ({p['sha256'][:12]})")


@plan_app.command("versions")
def plan_versions(group: str, url: str = UrlOpt, token: str = TokenOpt,
                  json_out: bool = JsonOpt) -> None:
    """Every version of the group's recovery plan, newest first."""
    ps = run(lambda: Api(url, token).get(f"/v1/groups/{group}/plan/versions"))
    if json_out:
        print_json(ps)
        return
    t = Table("version", "created", "by", "sha256", "boot groups")
    for p in ps:
        t.add_row(str(p["version"]), p["created_at"], p["created_by"] or "-", p["sha256"][:12],
                  " -> ".join(str(g.get("name") or "?") for g in
                              p["body"].get("boot_groups") or []) or "-")
    Console().print(t)


@app.command("list")
def drill_list(group: str, url: str = UrlOpt, token: str = TokenOpt, json_out: bool = JsonOpt,
               limit: int = typer.Option(20, min=1, max=500)) -> None:
    """The group's drills, newest first: job, state, verdict, recovery point, boot time."""
    api = Api(url, token)
    g = run(lambda: api.get(f"/v1/groups/{group}"))
    page = run(lambda: api.get("/v1/jobs", params={"kind": "drill", "group_id": g["id"],
                                                   "limit": limit}))
    if json_out:
        print_json(page["items"])
        return
    t = Table("job", "state", "verdict", "recovery point", "boot s", "created", "error")
    for j in page["items"]:
        r = j.get("result") or {}
        boot = r.get("boot_s")
        t.add_row(j["id"], j["state"], r.get("verdict") or "-",
                  r.get("recovery_point") or (j.get("params") or {}).get("recovery_point") or "-",
                  f"{boot:.1f}" if isinstance(boot, (int, float)) else "-",
                  j["created_at"], j.get("error_code") or "")
    Console().print(t)


@app.command("show")
def drill_show(job_id: str, url: str = UrlOpt, token: str = TokenOpt,
               json_out: bool = JsonOpt) -> None:
    """One drill's report: verdict, timeline, checks; exit status 1 unless it passed."""
    job = run(lambda: Api(url, token).get(f"/v1/jobs/{job_id}"))
    if job["kind"] != "drill":
        typer.echo(f"cutpoint drill show: job {job_id} is a {job['kind']} job, not a drill",
                   err=True)
        raise typer.Exit(1)
    report = job.get("result") or {}
    if json_out:
        print_json(job)
    elif report:
        _print_report(report)
    else:
        Console().print(f"drill {job_id}: {job['state']} {job.get('message') or ''}"
                        + (f" ({job['error_code']}: {job['error']})" if job.get("error") else ""))
    if job["state"] != "succeeded":
        raise typer.Exit(1)


@dr_app.command("status")
def dr_status(group: str, url: str = UrlOpt, token: str = TokenOpt, json_out: bool = JsonOpt,
              limit: int = typer.Option(10)) -> None:
    """Replication state per group snapshot and member: bytes, throughput, lag."""
    doc = run(lambda: Api(url, token).get(f"/v1/groups/{group}/replication",
                                          params={"limit": limit}))
    if json_out:
        print_json(doc)
        return
    c = Console()
    c.print(f"group {doc['group']} -> {doc['target_site']}; newest recovery point "
            f"{doc['newest_recovery_point']}; lag {doc['replication_lag_s']} s; achieved DR "
            f"RPO {doc['achieved_dr_rpo_s']} s; fencing epoch {doc['fencing_epoch']}")
    t = Table("snapshot", "state", "RP", "base", "member", "m.state", "full", "shipped B",
              "MB/s", "lag s")
    for s in doc["snapshots"]:
        rows = s["members"] or [None]
        for m in rows:
            t.add_row(s["txn"], s["state"], "yes" if s["recovery_point"] else "",
                      "yes" if s["replication_base"] else "",
                      m["disk"] if m else "", m["state"] if m else "",
                      str(m["full"]) if m else "", str(m["bytes_shipped"]) if m else "",
                      f"{m['throughput_mbps'] or 0:.1f}" if m else "",
                      f"{m['lag_s']:.1f}" if m and m["lag_s"] is not None else "")
    c.print(t)


@dr_app.command("replicate")
def dr_replicate(snapshot_id: int, verify_full: bool = typer.Option(False),
                 url: str = UrlOpt, token: str = TokenOpt, json_out: bool = JsonOpt) -> None:
    """Replicate (or retry) one group snapshot and follow the job."""
    api = Api(url, token)
    job = run(lambda: api.post(f"/v1/snapshots/{snapshot_id}/replicate",
                               json={"verify_full": verify_full}))
    job = watch_job(api, job["id"], quiet=json_out, timeout=1800)
    if json_out:
        print_json(job)
    if job["state"] != "succeeded":
        raise typer.Exit(1)


@dr_app.command("failover")
def dr_failover(group: str, mode: str = typer.Option(..., help="planned or unplanned"),
                recovery_point: str = typer.Option("latest"),
                workload: str = typer.Option("none", help="what the DR guests run"),
                yes: bool = typer.Option(False, "--yes", help="do not ask for confirmation"),
                url: str = UrlOpt, token: str = TokenOpt, json_out: bool = JsonOpt) -> None:
    """Fail the group over to DR and follow the job (result: RTO, fencing epoch).

    It stops the group's VMs at the primary and makes DR the only writer;
    asks first unless --yes."""
    confirm_or_exit("dr failover",
                    f"Fail group {group} over to its DR site ({mode})? Its primary VMs are "
                    "stopped and DR becomes the only writer.", yes)
    api = Api(url, token)
    job = run(lambda: api.post(f"/v1/groups/{group}/failover",
                               json={"recovery_point": recovery_point, "mode": mode,
                                     "workload": workload}))
    job = watch_job(api, job["id"], quiet=json_out, timeout=1800)
    if json_out:
        print_json(job)
    elif job.get("result"):
        r = job["result"]
        Console().print(f"RTO {r['rto_s']} s; fencing epoch {r['fence']['epoch']}; "
                        f"recovery point {r['recovery_point']}")
    if job["state"] != "succeeded":
        raise typer.Exit(1)


@dr_app.command("re-protect")
def dr_reprotect(group: str, url: str = UrlOpt, token: str = TokenOpt,
                 json_out: bool = JsonOpt) -> None:
    """After a failover: protect the group from where it runs now back to the site
    it left (a snapshot of the running VMs, deltas only), and follow the job."""
    api = Api(url, token)
    job = run(lambda: api.post(f"/v1/groups/{group}/re-protect"))
    job = watch_job(api, job["id"], quiet=json_out, timeout=3600)
    if json_out:
        print_json(job)
    elif job.get("result"):
        r = job["result"]
        Console().print(f"protected {r['active']} -> {r['protected_to']}: snapshot "
                        f"{r['txn']}, {r['bytes_shipped']} B shipped of {r['bytes_changed']} "
                        "B changed" + (f"; FULL COPY: {r['full_copy_why']}"
                                       if r["full_copy"] else ""))
    if job["state"] != "succeeded":
        raise typer.Exit(1)


@dr_app.command("failback")
def dr_failback(group: str, workload: str = typer.Option("none", help="what the guests run"),
                yes: bool = typer.Option(False, "--yes", help="do not ask for confirmation"),
                url: str = UrlOpt, token: str = TokenOpt, json_out: bool = JsonOpt) -> None:
    """Fail a re-protected group back to its original primary (a planned
    failover: the VMs at the active site are stopped), then re-protect it."""
    confirm_or_exit("dr failback",
                    f"Fail group {group} back to its original primary? Its VMs at the active "
                    "site are stopped; the original primary becomes the only writer.", yes)
    api = Api(url, token)
    job = run(lambda: api.post(f"/v1/groups/{group}/failback", json={"workload": workload}))
    job = watch_job(api, job["id"], quiet=json_out, timeout=3600)
    if json_out:
        print_json(job)
    elif job.get("result"):
        r = job["result"]
        rp = r["reprotect"]
        Console().print(f"back at {rp['active']}: RTO {r['rto_s']} s (failover job "
                        f"{r['failover_job']}); protected to {rp['protected_to']}: "
                        f"{rp['bytes_shipped']} B shipped of {rp['bytes_changed']} B changed")
    if job["state"] != "succeeded":
        raise typer.Exit(1)
