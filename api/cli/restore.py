"""`cutpoint restore clone GROUP` and `cutpoint restore in-place GROUP`."""

from __future__ import annotations

from typing import Any

import typer
from cutpoint.api.cli.apiclient import Api, JsonOpt, TokenOpt, UrlOpt, print_json, run
from cutpoint.api.cli.confirm import confirm_or_exit
from cutpoint.api.cli.job import watch_job
from cutpoint.api.cli.output import Console, Table

app = typer.Typer(help="Restore a group snapshot: as new clones, or in place.",
                  no_args_is_help=True)
SnapOpt = typer.Option(..., "--snapshot", help="group snapshot id, txn, or latest")
SiteOpt = typer.Option(None, "--site", help="the group's primary (default) or its DR site")
NameOpt = typer.Option([], "--name", help="DISK=IMAGE: the clone name of one member disk "
                       "(<vm>/<node>); repeatable")


def _follow(api: Api, job: dict[str, Any], json_out: bool, timeout: float) -> None:
    job = watch_job(api, job["id"], quiet=json_out, timeout=timeout, poll=0.5)
    if json_out:
        print_json(job)
    else:
        res = job.get("result") or {}
        t = Table("disk", "result")
        for d in res.get("disks", []):
            t.add_row(d["disk"], d.get("clone") or
                      (f"rolled back to {d['to']}" if d.get("rolled_back")
                       else f"unchanged since {d.get('to')}"))
        if res.get("disks"):
            Console().print(t)
    if job["state"] != "succeeded":
        raise typer.Exit(1)


@app.command("clone")
def clone(group: str, snapshot: str = SnapOpt, site: str | None = SiteOpt,
          suffix: str | None = typer.Option(None, help="clones are <image>-<suffix> "
                                            "(default restore-<snapshot id>)"),
          name: list[str] = NameOpt,
          url: str = UrlOpt, token: str = TokenOpt, json_out: bool = JsonOpt,
          timeout: float = typer.Option(1800, help="give up following after this")) -> None:
    """Clone every member disk's snapshot as a new image; the originals are untouched."""
    names = {}
    for n in name:
        disk, sep, image = n.partition("=")
        if not sep or not disk or not image:
            raise typer.BadParameter(f"{n!r}: want DISK=IMAGE", param_hint="--name")
        names[disk] = image
    body: dict[str, Any] = {"snapshot": snapshot, "site": site, "suffix": suffix,
                            "names": names or None}
    api = Api(url, token)
    job = run(lambda: api.post(f"/v1/groups/{group}/restore/clone",
                               json={k: v for k, v in body.items() if v is not None}))
    _follow(api, job, json_out, timeout)


@app.command("in-place")
def in_place(group: str, snapshot: str = SnapOpt, site: str | None = SiteOpt,
             yes: bool = typer.Option(False, "--yes", help="do not ask for confirmation"),
             url: str = UrlOpt, token: str = TokenOpt, json_out: bool = JsonOpt,
             timeout: float = typer.Option(1800, help="give up following after this")) -> None:
    """Roll every member image back to the snapshot (the group's VMs must be stopped).

    What the VMs wrote after the snapshot is lost; asks first unless --yes."""
    where = f"at site {site}" if site else "at the group's primary site"
    confirm_or_exit("restore in-place", f"Roll every disk of group {group} {where} back to "
                    f"snapshot {snapshot}? Data written since is lost.", yes)
    api = Api(url, token)
    body = {"snapshot": snapshot, **({"site": site} if site else {})}
    job = run(lambda: api.post(f"/v1/groups/{group}/restore/in-place", json=body))
    _follow(api, job, json_out, timeout)
