"""`cutpoint site …`: sites and their Ceph access, over the API.

    cutpoint site add dr --ceph-conf /etc/ceph/dr.conf --keyring \\
        /etc/ceph/dr.client.cutpoint.keyring --pool rbd
    cutpoint site check dr
    cutpoint site update dr --op-timeout 20
    cutpoint site show dr
    cutpoint site list

Registration and every change of the Ceph access run the site check on the
API side; a failing step is printed as a table and the command exits 1.
The keyring is given by path: the key stays in the file.
"""

from __future__ import annotations

from typing import Any

import typer
from cutpoint.api.cli.apiclient import (
    Api,
    ApiCallError,
    JsonOpt,
    TokenOpt,
    UrlOpt,
    err,
    print_json,
    run,
)
from cutpoint.api.cli.output import Console, Table

app = typer.Typer(help="Sites (failure domains) and their Ceph access.", no_args_is_help=True)

ConfOpt = typer.Option(None, "--ceph-conf", help="the site's ceph.conf (a path on the "
                       "control plane's machines)")
MonOpt = typer.Option(None, "--mon-host", help="a mon address, instead of --ceph-conf "
                      "(repeat for each mon)")
IdOpt = typer.Option(None, "--client-id", help="cephx client id, without 'client.' "
                     "(default cutpoint)")
KeyringOpt = typer.Option(None, "--keyring", help="that client's keyring file (the path; "
                          "the key stays in it)")
PoolOpt = typer.Option(None, "--pool", help="POOL or LOGICAL=POOL: the pool cutpoint's disks "
                       "name (as the primary's agents report it) and the pool at this site; "
                       "repeat for each")
ConnectOpt = typer.Option(None, "--connect-timeout", min=1, help="seconds (default 10)")
OpOpt = typer.Option(None, "--op-timeout", min=1, help="seconds per Ceph request (default 30)")
BulkOpt = typer.Option(None, "--bulk-timeout", min=1,
                       help="seconds for rollback, removal, diff (default 900)")
NoCheckOpt = typer.Option(False, "--no-check", help="store without the site check (a site "
                          "set up before its cluster answers); run `cutpoint site check` later")


def _pools(values: list[str] | None) -> dict[str, str] | None:
    if not values:
        return None
    out: dict[str, str] = {}
    for v in values:
        logical, _, real = v.partition("=")
        if not logical or ("=" in v and not real):
            err.print(f"error: --pool {v!r}: want POOL or LOGICAL=POOL")
            raise typer.Exit(2)
        out[logical] = real or logical
    return out


def _ceph_fields(ceph_conf: str | None, mon_host: list[str] | None, client_id: str | None,
                 keyring: str | None, pool: list[str] | None, connect: int | None,
                 op: int | None, bulk: int | None) -> dict[str, Any]:
    if ceph_conf and mon_host:
        err.print("error: give --ceph-conf or --mon-host, not both")
        raise typer.Exit(2)
    fields = {"ceph_conf": ceph_conf, "mon_host": mon_host or None, "client_id": client_id,
              "keyring": keyring, "pools": _pools(pool), "connect_timeout_s": connect,
              "op_timeout_s": op, "bulk_timeout_s": bulk}
    return {k: v for k, v in fields.items() if v is not None}


def _by_name(api: Api, name: str) -> dict[str, Any]:
    for s in run(lambda: api.all("/v1/sites")):
        if s["name"] == name:
            return dict(s)
    err.print(f"error: no site named {name!r}")
    raise typer.Exit(1)


def _steps_table(steps: list[dict[str, Any]]) -> Table:
    t = Table("check", "pool", "status", "ms", "detail")
    color = {"pass": "green", "fail": "red", "skip": "dim"}
    for s in steps:
        status = s["status"] + (f" {s['code']}" if s.get("code") else "")
        t.add_row(s["name"], s.get("pool") or "", f"[{color.get(s['status'], '')}]{status}[/]",
                  f"{s.get('ms', 0):.0f}", s.get("detail") or "")
    return t


def _call(fn: Any, json_out: bool) -> Any:
    """fn(); a failed site check prints its steps, then exits 1."""
    try:
        return fn()
    except ApiCallError as exc:
        body = exc.body if isinstance(exc.body, dict) else {}
        if json_out and body:
            print_json(body)
        else:
            err.print(f"[red]error:[/red] {exc}", markup=True, highlight=False)
            if body.get("checks"):
                Console(stderr=True).print(_steps_table(body["checks"]))
        raise typer.Exit(1) from None


def _describe(s: dict[str, Any]) -> str:
    c = s.get("ceph")
    if not c:
        return "no Ceph access"
    where = c["ceph_conf"] or ",".join(c["mon_host"] or [])
    pools = ", ".join(k if k == v else f"{k}={v}" for k, v in c["pools"].items())
    return f"client.{c['client_id']} at {where}, pools {pools}"


def _check_word(s: dict[str, Any]) -> str:
    last = s.get("last_check")
    if not last:
        return "-"
    if last["ok"]:
        return f"ok {last.get('checked_at') or ''}".strip()
    where = f" ({last['failed_pool']})" if last.get("failed_pool") else ""
    return f"failed: {last['failed_check']}{where} {last.get('checked_at') or ''}".strip()


@app.command("add")
def add(name: str, description: str = typer.Option("", "--description"),
        ceph_conf: str | None = ConfOpt, mon_host: list[str] | None = MonOpt,
        client_id: str | None = IdOpt, keyring: str | None = KeyringOpt,
        pool: list[str] | None = PoolOpt, connect: int | None = ConnectOpt,
        op: int | None = OpOpt, bulk: int | None = BulkOpt, no_check: bool = NoCheckOpt,
        url: str = UrlOpt, token: str = TokenOpt, json_out: bool = JsonOpt) -> None:
    """Register a site; with Ceph access (--ceph-conf or --mon-host, --pool), checked first."""
    ceph = _ceph_fields(ceph_conf, mon_host, client_id, keyring, pool, connect, op, bulk)
    body: dict[str, Any] = {"name": name, "description": description, "check": not no_check}
    if ceph:
        if "pools" not in ceph:
            err.print("error: Ceph access needs at least one --pool")
            raise typer.Exit(2)
        body["ceph"] = ceph
    api = Api(url, token)
    s = _call(lambda: api.post("/v1/sites", json=body), json_out)
    if json_out:
        print_json(s)
        return
    typer.echo(f"site {s['name']} id={s['id']}: {_describe(s)}; check {_check_word(s)}")


@app.command("update")
def update(name: str, description: str | None = typer.Option(None, "--description"),
           ceph_conf: str | None = ConfOpt, mon_host: list[str] | None = MonOpt,
           client_id: str | None = IdOpt, keyring: str | None = KeyringOpt,
           pool: list[str] | None = PoolOpt, connect: int | None = ConnectOpt,
           op: int | None = OpOpt, bulk: int | None = BulkOpt,
           default_keyring: bool = typer.Option(False, "--default-keyring",
                                                help="forget the keyring path (Ceph's "
                                                     "default search)"),
           remove_ceph: bool = typer.Option(False, "--remove-ceph",
                                            help="forget the site's Ceph access"),
           no_check: bool = NoCheckOpt,
           url: str = UrlOpt, token: str = TokenOpt, json_out: bool = JsonOpt) -> None:
    """Change a site; a changed Ceph access is checked first. --pool replaces the pool map."""
    ceph: dict[str, Any] | None = _ceph_fields(ceph_conf, mon_host, client_id, keyring, pool,
                                               connect, op, bulk)
    assert ceph is not None
    if ceph_conf:
        ceph["mon_host"] = None  # one way to the mons: the file replaces the addresses
    if mon_host:
        ceph["ceph_conf"] = None
    if default_keyring:
        ceph["keyring"] = None
    body: dict[str, Any] = {"check": not no_check}
    if description is not None:
        body["description"] = description
    if remove_ceph:
        if ceph:
            err.print("error: --remove-ceph takes no other Ceph option")
            raise typer.Exit(2)
        body["ceph"] = None
    elif ceph:
        body["ceph"] = ceph
    api = Api(url, token)
    site = _by_name(api, name)
    s = _call(lambda: api.patch(f"/v1/sites/{site['id']}", json=body), json_out)
    if json_out:
        print_json(s)
        return
    typer.echo(f"site {s['name']} v{s['version']}: {_describe(s)}; check {_check_word(s)}")


@app.command("check")
def check(name: str, url: str = UrlOpt, token: str = TokenOpt,
          json_out: bool = JsonOpt) -> None:
    """Run the site check now: connect, pools, snapshot, write, diff on a scratch image."""
    api = Api(url, token)
    site = _by_name(api, name)
    r = _call(lambda: api.post(f"/v1/sites/{site['id']}/check"), json_out)
    if json_out:
        print_json(r)
        return
    Console().print(_steps_table(r["steps"]))
    for lat in r.get("snapshot_latency") or []:
        typer.echo(f"pool {lat['pool']}: snapshot p50 {lat['p50_ms']:.1f} ms, p99 "
                   f"{lat['p99_ms']:.1f} ms (n={len(lat['samples_ms'])}); a VM's pause on the "
                   f"in_pause path: about {lat['in_pause_pause_p50_ms']:.0f} / "
                   f"{lat['in_pause_pause_p99_ms']:.0f} ms (p50 / p99); on the redirect path "
                   f"it does not wait for snapshots")
    typer.echo(f"site {name}: check passed")


@app.command("show")
def show(name: str, url: str = UrlOpt, token: str = TokenOpt,
         json_out: bool = JsonOpt) -> None:
    """One site: its Ceph access and its last check."""
    s = _by_name(Api(url, token), name)
    if json_out:
        print_json(s)
        return
    c = s.get("ceph")
    typer.echo(f"site {s['name']} id={s['id']} v{s['version']}  {s['description']}".rstrip())
    if not c:
        typer.echo("  Ceph access: none")
    else:
        shown = {**c, "keyring": c["keyring"] or "(Ceph's default search)",
                 "pools": ", ".join(k if k == v else f"{k}={v}" for k, v in c["pools"].items())}
        for k in ("ceph_conf", "mon_host", "client_id", "keyring", "pools",
                  "connect_timeout_s", "op_timeout_s", "bulk_timeout_s"):
            v = shown.get(k)
            if v is not None:
                typer.echo(f"  {k}: {','.join(v) if isinstance(v, list) else v}")
    typer.echo(f"  last check: {_check_word(s)}")
    if s.get("last_check"):
        Console().print(_steps_table(s["last_check"]["steps"]))


@app.command("list")
def list_(url: str = UrlOpt, token: str = TokenOpt, json_out: bool = JsonOpt) -> None:
    """List sites, their Ceph access and their last check."""
    items = run(lambda: Api(url, token).all("/v1/sites"))
    if json_out:
        print_json(items)
        return
    t = Table("id", "name", "Ceph access", "last check", "description")
    for s in items:
        t.add_row(str(s["id"]), s["name"], _describe(s), _check_word(s), s["description"])
    Console().print(t)
