"""Destructive commands ask first, and never guess off a terminal.

A command that stops VMs, rolls disks back or deletes asks on the terminal
unless `--yes` is given.  With no terminal to ask on (a script, a pipe, a
cron job), it refuses with exit status 2 and says to pass `--yes`: a
confirmation read from a pipe would be whatever the pipe held.
"""

from __future__ import annotations

import sys

import typer

NOT_CONFIRMED = 2  # the exit status of a refused or declined confirmation


def confirm_or_exit(command: str, question: str, yes: bool) -> None:
    """Return when the operator confirmed (or passed --yes); exit 2 otherwise."""
    if yes:
        return
    if not sys.stdin.isatty():
        typer.echo(f"cutpoint {command}: not confirmed: {question} "
                   "(no terminal to ask on: pass --yes)", err=True)
        raise typer.Exit(NOT_CONFIRMED)
    if not typer.confirm(question, default=False):
        typer.echo(f"cutpoint {command}: not confirmed; nothing was done", err=True)
        raise typer.Exit(NOT_CONFIRMED)
