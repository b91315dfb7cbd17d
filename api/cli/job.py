"""`cutpoint job list|show|watch`."""

from __future__ import annotations

import time
from typing import Any

import typer
from cutpoint.api.cli.apiclient import Api, JsonOpt, TokenOpt, UrlOpt, print_json, run
from cutpoint.api.cli.output import Console, Table
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

app = typer.Typer(help="Background jobs.", no_args_is_help=True)
FINAL = {"succeeded", "failed"}


def watch_job(api: Api, job_id: str, *, quiet: bool = False, timeout: float = 600,
              poll: float = 0.25) -> dict[str, Any]:
    """Poll a job until it ends, with a live progress bar unless quiet."""
    deadline = time.monotonic() + timeout
    job: dict[str, Any] = run(lambda: api.get(f"/v1/jobs/{job_id}"))
    if quiet:
        while job["state"] not in FINAL and time.monotonic() < deadline:
            time.sleep(poll)
            job = run(lambda: api.get(f"/v1/jobs/{job_id}"))
        return job
    with Progress(TextColumn("{task.description}"), BarColumn(),
                  TextColumn("{task.fields[msg]}"), TimeElapsedColumn(),
                  console=Console(stderr=True), transient=False) as prog:
        t = prog.add_task(f"{job['kind']} {job_id[:8]}", total=1.0, msg=job["message"])
        while True:
            prog.update(t, completed=job["progress"], msg=job["message"])
            if job["state"] in FINAL or time.monotonic() > deadline:
                break
            time.sleep(poll)
            job = run(lambda: api.get(f"/v1/jobs/{job_id}"))
        prog.update(t, completed=1.0 if job["state"] in FINAL else job["progress"],
                    msg=job["state"] + (f" ({job['error_code']})" if job["error_code"] else ""))
    if job["state"] == "failed":
        Console(stderr=True).print(f"[red]job failed[/red]: {job['error_code']}: "
                                   f"{(job['error'] or '')[:500]}")
    return job


@app.command("watch")
def watch(job_id: str, url: str = UrlOpt, token: str = TokenOpt, json_out: bool = JsonOpt,
          timeout: float = typer.Option(600, help="give up after this many seconds")) -> None:
    """Follow a job until it ends; exit status 1 if it failed."""
    job = watch_job(Api(url, token), job_id, quiet=json_out, timeout=timeout)
    if json_out:
        print_json(job)
    if job["state"] != "succeeded":
        raise typer.Exit(1)


@app.command("show")
def show(job_id: str, url: str = UrlOpt, token: str = TokenOpt, json_out: bool = JsonOpt) -> None:
    """Show one job."""
    job = run(lambda: Api(url, token).get(f"/v1/jobs/{job_id}"))
    if json_out:
        print_json(job)
        return
    for k, v in job.items():
        typer.echo(f"{k:12} {v}")


@app.command("list")
def list_(url: str = UrlOpt, token: str = TokenOpt, json_out: bool = JsonOpt,
          kind: str | None = typer.Option(None, help="only jobs of this kind"),
          limit: int = typer.Option(20, min=1, max=500)) -> None:
    """The newest jobs."""
    params: dict[str, Any] = {"limit": limit}
    if kind:
        params["kind"] = kind
    items = run(lambda: Api(url, token).get("/v1/jobs", params=params))["items"]
    if json_out:
        print_json(items)
        return
    t = Table("id", "kind", "state", "progress", "created", "error")
    for j in items:
        t.add_row(j["id"][:8], j["kind"], j["state"], f"{j['progress']:.0%}", j["created_at"],
                  j["error_code"] or "")
    Console().print(t)


@app.command("events")
def events(job_id: str, url: str = UrlOpt, token: str = TokenOpt,
           json_out: bool = JsonOpt) -> None:
    """The job's steps, in order, with their time."""
    items = run(lambda: Api(url, token).get(f"/v1/jobs/{job_id}/events"))
    if json_out:
        print_json(items)
        return
    t = Table("#", "at", "t (s)", "step", "status", "detail")
    for e in items:
        d = e["detail"]
        text = d.get("message") or d.get("error") or ", ".join(
            f"{k}={v}" for k, v in d.items() if not isinstance(v, (dict, list)))
        t.add_row(str(e["seq"]), e["at"][11:23], "" if e["t_s"] is None else f"{e['t_s']:.2f}",
                  e["step"], e["status"], str(text)[:100])
    Console().print(t)
