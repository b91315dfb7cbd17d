"""`cutpoint host …` over the API (sites: site.py)."""

from __future__ import annotations

import hashlib
import ssl
from pathlib import Path
from typing import Annotated

import typer
from cutpoint.api.cli.apiclient import Api, JsonOpt, TokenOpt, UrlOpt, print_json, run
from cutpoint.api.cli.job import watch_job
from cutpoint.api.cli.output import Console, Table
from cutpoint.api.cli.revoke import DEFAULT_CA_DIR, RevokeError, revoke

host_app = typer.Typer(help="Hypervisor hosts and their agents.", no_args_is_help=True)


def _fingerprint_of(pem: Path) -> str:
    """SHA-256 (hex) of the DER form of the PEM certificate in `pem`."""
    try:
        der = ssl.PEM_cert_to_DER_cert(pem.read_text())
    except (OSError, ValueError) as exc:
        raise typer.BadParameter(f"{pem}: not a readable PEM certificate ({exc})",
                                 param_hint="--cert") from None
    return hashlib.sha256(der).hexdigest()


@host_app.command("add")
def host_add(name: str, site: str = typer.Option(..., "--site"),
             address: str = typer.Option(..., "--address"),
             port: int = typer.Option(7443, "--port"),
             fingerprint: str | None = typer.Option(None, "--fingerprint",
                                                    help="agent cert SHA-256 (hex)"),
             cert: Annotated[Path | None, typer.Option(
                 "--cert", help="the agent's certificate (PEM): its SHA-256 becomes the "
                 "pin")] = None,
             sync: bool = typer.Option(True, "--sync/--no-sync",
                                       help="pull the agent's inventory now"),
             url: str = UrlOpt, token: str = TokenOpt, json_out: bool = JsonOpt) -> None:
    """Register a host's agent, pinned to its certificate (and pull its inventory)."""
    if cert is not None:
        fingerprint = _fingerprint_of(cert)
    if not fingerprint:
        raise typer.BadParameter(
            "a host is registered pinned to its agent's certificate: give --cert AGENT.pem "
            "or --fingerprint SHA256 (hex of the DER certificate)",
            param_hint="--cert / --fingerprint")
    api = Api(url, token)
    body = {"name": name, "site": site, "address": address, "port": port,
            "cert_fingerprint": fingerprint}
    h = run(lambda: api.post("/v1/hosts", json=body))
    if not json_out:
        typer.echo(f"host {h['name']} id={h['id']} {h['address']}:{h['port']}")
    if sync:
        job = run(lambda: api.post(f"/v1/hosts/{h['id']}/sync"))
        job = watch_job(api, job["id"], quiet=json_out)
        h["sync"] = job
    if json_out:
        print_json(h)


@host_app.command("list")
def host_list(url: str = UrlOpt, token: str = TokenOpt, json_out: bool = JsonOpt) -> None:
    """List hosts and whether their agents answer."""
    items = run(lambda: Api(url, token).all("/v1/hosts"))
    if json_out:
        print_json(items)
        return
    t = Table("id", "name", "site", "address", "reachable", "last seen", "agent")
    for h in items:
        t.add_row(str(h["id"]), h["name"], h["site"], f"{h['address']}:{h['port']}",
                  {True: "yes", False: "[red]no[/red]", None: "?"}[h["reachable"]],
                  h["last_seen_at"] or "", h["agent_version"] or "")
    Console().print(t)


@host_app.command("sync")
def host_sync(name: str, url: str = UrlOpt, token: str = TokenOpt,
              json_out: bool = JsonOpt) -> None:
    """Pull a host's inventory now and wait for it."""
    api = Api(url, token)
    hosts = run(lambda: api.all("/v1/hosts"))
    h = next((x for x in hosts if x["name"] == name), None)
    if h is None:
        Console(stderr=True).print(f"error: no host named {name!r}")
        raise typer.Exit(1)
    job = run(lambda: api.post(f"/v1/hosts/{h['id']}/sync"))
    job = watch_job(api, job["id"], quiet=json_out)
    if json_out:
        print_json(job)
    if job["state"] != "succeeded":
        raise typer.Exit(1)


@host_app.command("revoke")
def host_revoke(
    name: str,
    ca_dir: Annotated[Path, typer.Option(
        "--ca-dir", help="the deployment CA directory (Ansible's cutpoint_ca_dir)")
    ] = DEFAULT_CA_DIR,
    cert: Annotated[Path | None, typer.Option(
        "--cert", help="the certificate to revoke; default CA_DIR/NAME.pem")] = None,
) -> None:
    """Revoke a host's (or any) certificate: its serial goes on CA_DIR/revoked.

    The agents refuse it once they have the new list and a SIGHUP: run the
    site playbook (the cutpoint_host role copies the list and reloads them)."""
    try:
        serial, added = revoke(ca_dir, name, cert)
    except RevokeError as exc:
        Console(stderr=True).print(f"error: {exc}")
        raise typer.Exit(1) from None
    state = "revoked" if added else "already revoked"
    typer.echo(f"{name}: serial {serial} {state} in {ca_dir / 'revoked'}; "
               "distribute it: ansible-playbook site.yml --tags cutpoint_revoked")
