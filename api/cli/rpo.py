"""`cutpoint rpo status|misses`."""

from __future__ import annotations

import typer
from cutpoint.api.cli.apiclient import Api, JsonOpt, TokenOpt, UrlOpt, print_json, run
from cutpoint.api.cli.output import Console, Table

app = typer.Typer(help="Recovery point objectives.", no_args_is_help=True)


@app.command("status")
def status(group: str | None = typer.Argument(None, help="one group (default: all)"),
           url: str = UrlOpt, token: str = TokenOpt, json_out: bool = JsonOpt) -> None:
    """Achieved RPO against target, per group."""
    api = Api(url, token)
    names = [group] if group else [g["name"] for g in run(lambda: api.all("/v1/groups"))]
    rows = [run(lambda n=n: api.get(f"/v1/groups/{n}/rpo")) for n in names]
    if json_out:
        print_json(rows if group is None else rows[0])
        return
    t = Table("group", "target s", "achieved s", "compliant", "newest recovery point",
              "next due", "misses", "last miss", "drill")
    for r in rows:
        ok = {True: "[green]yes[/green]", False: "[red]NO[/red]", None: "-"}[r["compliant"]]
        lm = r["last_miss"]
        t.add_row(r["group"], str(r["rpo_seconds"] or "-"),
                  "-" if r["achieved_rpo_s"] is None else f"{r['achieved_rpo_s']:.1f}", ok,
                  r["newest_recovery_point"] or "-", r["next_due_at"] or "-", str(r["misses"]),
                  f"{lm['at']} {lm['reason']}" if lm else "", _drill(r.get("drill")))
    Console().print(t)


def _drill(d: dict[str, object] | None) -> str:
    """The group's drill standing: its result, and the last success."""
    if not d:
        return "-"
    color = {"passed": "green", "failed": "red", "overdue": "red"}.get(str(d["result"]))
    res = f"[{color}]{d['result']}[/{color}]" if color else str(d["result"])
    return res + (f" (last pass {d['last_success_at']})" if d.get("last_success_at") else "")


@app.command("misses")
def misses(group: str, limit: int = typer.Option(20, min=1, max=500), url: str = UrlOpt,
           token: str = TokenOpt, json_out: bool = JsonOpt) -> None:
    """A group's recorded RPO misses, newest first."""
    items = run(lambda: Api(url, token).get(f"/v1/groups/{group}/rpo/misses",
                                            params={"limit": limit}))["items"]
    if json_out:
        print_json(items)
        return
    t = Table("at", "reason", "achieved s", "target s", "detail")
    for m in items:
        t.add_row(m["at"], m["reason"], f"{m['achieved_rpo_s']:.1f}", str(m["rpo_seconds"]),
                  m["detail"][:80])
    Console().print(t)
