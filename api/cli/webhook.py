"""`cutpoint webhook add|list|delete|deliveries`: event notifications over the API.

The signing secret stays in a file on the control plane hosts; the API and
this command only ever see its path."""

from __future__ import annotations

import typer
from cutpoint.api.cli.apiclient import Api, JsonOpt, TokenOpt, UrlOpt, print_json, run
from cutpoint.api.cli.confirm import confirm_or_exit
from cutpoint.api.cli.output import Console, Table

app = typer.Typer(help="Webhooks: signed event notifications (RPO, replication, drills, "
                       "failover).", no_args_is_help=True)


EventOpt = typer.Option(..., "--event", help="event kind (repeatable; `cutpoint webhook events`)")


@app.command("add")
def add(name: str, url: str = typer.Argument(..., help="http(s) URL the events are POSTed to"),
        event: list[str] = EventOpt,
        secret_file: str = typer.Option(..., help="absolute path, on the control plane "
                                                  "hosts, of the file with the HMAC secret"),
        api_url: str = UrlOpt, token: str = TokenOpt, json_out: bool = JsonOpt) -> None:
    """Subscribe URL to the events; each delivery is signed (X-Cutpoint-Signature)."""
    w = run(lambda: Api(api_url, token).post("/v1/webhooks", json={
        "name": name, "url": url, "events": event, "secret_file": secret_file}))
    if json_out:
        print_json(w)
    else:
        typer.echo(f"webhook {w['name']} id={w['id']}: {', '.join(w['events'])} -> {w['url']}")


@app.command("events")
def events(api_url: str = UrlOpt, token: str = TokenOpt, json_out: bool = JsonOpt) -> None:
    """The event kinds a webhook can subscribe to."""
    kinds = run(lambda: Api(api_url, token).get("/v1/webhooks/events"))
    print_json(kinds) if json_out else typer.echo("\n".join(kinds))


@app.command("list")
def list_(api_url: str = UrlOpt, token: str = TokenOpt, json_out: bool = JsonOpt) -> None:
    """List webhooks."""
    items = run(lambda: Api(api_url, token).all("/v1/webhooks"))
    if json_out:
        print_json(items)
        return
    t = Table("id", "name", "events", "url", "secret file", "created")
    for w in items:
        t.add_row(str(w["id"]), w["name"], ",".join(w["events"]), w["url"], w["secret_file"],
                  w["created_at"])
    Console().print(t)


@app.command("deliveries")
def deliveries(name: str, api_url: str = UrlOpt, token: str = TokenOpt,
               json_out: bool = JsonOpt) -> None:
    """The webhook's deliveries, newest first: state, attempts, the last answer."""
    page = run(lambda: Api(api_url, token).get(f"/v1/webhooks/{name}/deliveries"))
    if json_out:
        print_json(page["items"])
        return
    t = Table("id", "event", "state", "attempts", "last status", "created", "delivered",
              "last error")
    for d in page["items"]:
        t.add_row(str(d["id"]), d["event"], d["state"], str(d["attempts"]),
                  str(d["last_status"] or "-"), d["created_at"], d["delivered_at"] or "-",
                  d["last_error"] or "")
    Console().print(t)


@app.command("delete")
def delete(name: str, yes: bool = typer.Option(False, "--yes", help="do not ask for confirmation"),
           api_url: str = UrlOpt, token: str = TokenOpt) -> None:
    """Delete the webhook and its deliveries' record."""
    confirm_or_exit("webhook delete", f"Delete webhook {name} and its delivery record?", yes)
    run(lambda: Api(api_url, token).call("DELETE", f"/v1/webhooks/{name}"))
    typer.echo(f"webhook {name} deleted")
