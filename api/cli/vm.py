"""`cutpoint vm list` and `cutpoint vm show NAME`: the VMs the agents report.

What the control plane knows of each VM (GET /v1/vms): its site and host,
state, identity, disks (target, pool/image or file, size), the groups its
disks are in, and its newest committed group snapshot; `show` adds its
captured definition's newest version (GET /v1/vms/{id}/definitions).  The inventory
watch keeps it within a few seconds of the agents (docs/operations.md).
"""

from __future__ import annotations

from typing import Any

import typer
from cutpoint.api.cli.apiclient import Api, JsonOpt, TokenOpt, UrlOpt, print_json, run
from cutpoint.api.cli.output import Console, Table

app = typer.Typer(help="VMs and their disks, as the hosts' agents report them.",
                  no_args_is_help=True)

SiteOpt = typer.Option(None, "--site", help="only VMs on hosts of this site")
HostOpt = typer.Option(None, "--host", help="only VMs on this host")


def _gib(n: int | None) -> str:
    return "" if n is None else f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def _source(d: dict[str, Any]) -> str:
    return f"{d['pool']}/{d['image']}" if d.get("image") else d.get("file") or ""


def _state(v: dict[str, Any]) -> str:
    if not v["present"]:
        return "[dim]gone[/dim]"
    return f"{v['state']} (stale)" if v["stale"] else v["state"]


def _last(v: dict[str, Any]) -> str:
    s = v.get("last_snapshot")
    return "" if not s else f"{s['group']} {s['txn']} {s['finished_at'] or ''}"


@app.command("list")
def vm_list(site: str | None = SiteOpt, host: str | None = HostOpt,
            all_: bool = typer.Option(False, "--all",
                                      help="also VMs their host no longer reports"),
            url: str = UrlOpt, token: str = TokenOpt, json_out: bool = JsonOpt) -> None:
    """List VMs per site and host: state, disks, groups, identity, last snapshot."""
    params: dict[str, Any] = {k: v for k, v in (("site", site), ("host", host)) if v}
    if not all_:
        params["present"] = "true"
    items = run(lambda: Api(url, token).all("/v1/vms", **params))
    items.sort(key=lambda v: (v["site"], v["host"], v["name"]))
    if json_out:
        print_json(items)
        return
    t = Table("site", "host", "vm", "state", "disks", "groups", "identity", "last snapshot")
    for v in items:
        disks = ", ".join(f"{d['node']}={_source(d)}" + (f" {_gib(d['size_bytes'])}"
                                                          if d["size_bytes"] else "")
                          for d in v["disks"])
        t.add_row(v["site"], v["host"], v["name"], _state(v), disks,
                  ", ".join(v["groups"]), v["uid"] or "(host+name)", _last(v))
    Console().print(t)


@app.command("show")
def vm_show(name: str, site: str | None = SiteOpt, host: str | None = HostOpt,
            url: str = UrlOpt, token: str = TokenOpt, json_out: bool = JsonOpt) -> None:
    """Show one VM (by name, or by its uid); --host when two hosts have that name."""
    api = Api(url, token)
    params = {k: v for k, v in (("site", site), ("host", host)) if v}
    found = run(lambda: api.all("/v1/vms", name=name, **params)) \
        or run(lambda: api.all("/v1/vms", uid=name, **params))
    present = [v for v in found if v["present"]]
    if len(found) > 1 and len(present) == 1:
        found = present
    if len(found) != 1:
        where = ", ".join(f"{v['host']} (id {v['id']})" for v in found)
        Console(stderr=True).print(
            f"error: no VM named {name!r}" if not found else
            f"error: {len(found)} VMs are named {name!r}: {where}; give --host")
        raise typer.Exit(1)
    v = found[0]
    defs = run(lambda: api.get(f"/v1/vms/{v['id']}/definitions"))
    if json_out:
        print_json({**v, "definitions": defs})
        return
    c = Console()
    c.print(f"[bold]{v['name']}[/bold]  id={v['id']}  site={v['site']}  host={v['host']}  "
            f"driver={v['driver']}")
    c.print(f"state: {_state(v)}  (synced {v['synced_at']})")
    c.print(f"identity: {v['identity']} {v['uid'] or ''}")
    c.print(f"groups: {', '.join(v['groups']) or '-'}")
    s = v.get("last_snapshot")
    c.print("last snapshot: " + (f"{s['group']} txn={s['txn']} cut={s['cut_at']} "
                                 f"consistency={s['consistency']} "
                                 f"dr_verified={s['dr_verified_at'] or '-'}" if s else "-"))
    d = defs[-1] if defs else None
    c.print("definition: " + (f"v{d['version']} {d['format']} sha256={d['sha256'][:12]} "
                              f"captured={d['captured_at']} from={d['host']} "
                              f"dr={d.get('dr_status', '?')}" if d else
                              "- (captured once the VM is in a group)"))
    for why in (d or {}).get("dr_refusals", []):
        c.print(f"  not signed for DR: {why}")
    t = Table("target", "backend", "source", "size", "group", "present")
    for d in v["disks"]:
        t.add_row(d["node"], d["backend"], _source(d), _gib(d["size_bytes"]),
                  d["group"] or "", "yes" if d["present"] else "no")
    c.print(t)
