"""`cutpoint token create|list|revoke`: API tokens, straight in the database.

This works before any token exists (it is how the first admin token is
made), so it reads the server settings (CUTPOINT_CONFIG / CUTPOINT_*)
rather than calling the API.
"""

from __future__ import annotations

import os
from pathlib import Path

import typer
from cutpoint.api.cli.apiclient import JsonOpt, print_json
from cutpoint.api.cli.output import Console, Table
from sqlalchemy import select

app = typer.Typer(help="API tokens (run where the server's settings are).",
                  no_args_is_help=True)
ConfigOpt = typer.Option(None, "--config", "-c", help="settings file (TOML); "
                         "default $CUTPOINT_CONFIG")


def _settings(config: Path | None):  # type: ignore[no-untyped-def]
    if config is not None:
        os.environ["CUTPOINT_CONFIG"] = str(config)
    from cutpoint.api.config import ConfigFileError, get_settings
    from pydantic import ValidationError

    get_settings.cache_clear()
    try:
        return get_settings()
    except (ValidationError, ConfigFileError) as exc:
        Console(stderr=True).print(f"error: bad settings: {exc}")
        raise typer.Exit(2) from None


@app.command("create")
def create(name: str = typer.Argument(..., help="a name for the token (unique)"),
           role: str = typer.Option(..., "--role", help="viewer, operator or admin"),
           config: Path | None = ConfigOpt, json_out: bool = JsonOpt) -> None:
    """Create a token and print it (it is shown only this once)."""
    from cutpoint.api.db import session_scope
    from cutpoint.api.errors import ApiError
    from cutpoint.api.models import Role
    from cutpoint.api.services import tokens

    if role not in {r.value for r in Role}:
        raise typer.BadParameter(f"{role!r}: choose viewer, operator or admin", param_hint="--role")
    st = _settings(config)
    with session_scope(st.database_url) as s:
        try:
            row, tok = tokens.create(s, name, Role(role), st.token_secret.get_secret_value())
        except ApiError as exc:
            Console(stderr=True).print(f"error: {exc.detail}")
            raise typer.Exit(1) from None
    if json_out:
        print_json({"id": row.id, "name": row.name, "role": row.role.value, "token": tok})
    else:
        typer.echo(tok)


@app.command("list")
def list_(config: Path | None = ConfigOpt, json_out: bool = JsonOpt) -> None:
    """List tokens (never the tokens themselves)."""
    from cutpoint.api.db import session_scope
    from cutpoint.api.models import ApiToken

    st = _settings(config)
    with session_scope(st.database_url) as s:
        rows = [{"id": t.id, "name": t.name, "role": t.role.value, "prefix": t.prefix,
                 "created_at": t.created_at.isoformat(),
                 "revoked": t.revoked_at is not None}
                for t in s.scalars(select(ApiToken).order_by(ApiToken.id))]
    if json_out:
        print_json(rows)
        return
    t = Table("id", "name", "role", "prefix", "created", "revoked")
    for r in rows:
        t.add_row(str(r["id"]), r["name"], r["role"], r["prefix"], r["created_at"],
                  "yes" if r["revoked"] else "")
    Console().print(t)


@app.command("revoke")
def revoke(name: str, config: Path | None = ConfigOpt) -> None:
    """Revoke a token by name."""
    from cutpoint.api.db import session_scope
    from cutpoint.api.models import ApiToken
    from cutpoint.api.services import tokens

    st = _settings(config)
    with session_scope(st.database_url) as s:
        row = s.scalar(select(ApiToken).where(ApiToken.name == name))
        if row is None:
            Console(stderr=True).print(f"error: no token named {name!r}")
            raise typer.Exit(1)
        tokens.revoke(s, row.id)
    typer.echo(f"revoked {name}")
