"""`cutpoint` in scripts, against a real API process: a table piped to a file
keeps every cell whole (tab-separated, full timestamps), and a destructive
command with no terminal to ask on does nothing unless it has `--yes`."""

from __future__ import annotations

import io
import json
from pathlib import Path

from apiserver import api_server  # api/tests/apiserver.py
from cutpoint.api.cli.output import Console, Table


def test_a_piped_table_keeps_every_cell(tmp_path: Path) -> None:
    with api_server(tmp_path) as srv:
        name = "a-token-name-long-enough-that-a-40-column-table-would-cut-it"
        assert srv.cli("token", "create", name, "--role", "viewer").returncode == 0
        want = {t["name"]: t for t in json.loads(srv.cli("token", "list", "--json").stdout)}
        # A narrow "terminal" width must not matter off a terminal.
        r = srv.cli("token", "list", columns=40)
        assert r.returncode == 0, r.stderr
        lines = r.stdout.splitlines()
        assert lines[0].split("\t") == ["id", "name", "role", "prefix", "created", "revoked"]
        rows = {c[1]: c for c in (ln.split("\t") for ln in lines[1:])}
        assert set(rows) == set(want), r.stdout
        for n, t in want.items():
            assert rows[n][0] == str(t["id"]) and rows[n][2] == t["role"], rows[n]
            assert str(t["created_at"])[:19] in rows[n][4], (rows[n], t["created_at"])
        assert "…" not in r.stdout and "─" not in r.stdout  # no cut cell, no box

        # The negative control: on a narrow terminal the same table is a
        # Rich table and its cells are cut, which the checks above catch.
        t = Table("created")
        t.add_row(str(next(iter(want.values()))["created_at"]))
        buf = io.StringIO()
        Console(file=buf, force_terminal=True, width=12).print(t)
        assert "…" in buf.getvalue() and "─" in buf.getvalue(), buf.getvalue()


def test_destructive_commands_refuse_without_a_terminal(tmp_path: Path) -> None:
    with api_server(tmp_path) as srv:
        assert srv.cli("group", "create", "g1").returncode == 0
        for args in (("dr", "failover", "g1", "--mode", "planned"),
                     ("dr", "failback", "g1"),
                     ("restore", "in-place", "g1", "--snapshot", "latest"),
                     ("group", "delete", "g1")):
            r = srv.cli(*args, stdin="y\n")  # a pipe's "y" is not a confirmation
            assert r.returncode == 2, (args, r.stdout, r.stderr)
            assert "not confirmed" in r.stderr and "pass --yes" in r.stderr, (args, r.stderr)
        # Nothing happened: no job queued, the group is still there.
        assert json.loads(srv.cli("job", "list", "--json").stdout) == []
        assert [g["name"] for g in json.loads(srv.cli("group", "list", "--json").stdout)] \
            == ["g1"]

        # With --yes the request goes to the API, which answers for itself
        # (here: the group has no DR site to fail over to).
        r = srv.cli("dr", "failover", "g1", "--mode", "planned", "--yes")
        assert r.returncode == 1 and "not confirmed" not in r.stderr, r.stderr
        assert "POST /v1/groups/g1/failover" in r.stderr, r.stderr

        r = srv.cli("group", "delete", "g1", "--yes")
        assert r.returncode == 0 and "group g1 deleted" in r.stdout, r.stderr
        assert json.loads(srv.cli("group", "list", "--json").stdout) == []


def test_drill_list_and_show(tmp_path: Path) -> None:
    with api_server(tmp_path) as srv:
        assert srv.cli("group", "create", "g1").returncode == 0
        r = srv.cli("drill", "list", "g1")
        assert r.returncode == 0, r.stderr
        assert r.stdout.splitlines() == [
            "job\tstate\tverdict\trecovery point\tboot s\tcreated\terror"]
        assert json.loads(srv.cli("drill", "list", "g1", "--json").stdout) == []
        r = srv.cli("drill", "list", "nope")
        assert r.returncode == 1 and "group_not_found" in r.stderr, r.stderr
        r = srv.cli("drill", "show", "00000000-0000-0000-0000-000000000000")
        assert r.returncode == 1 and "404" in r.stderr, r.stderr
