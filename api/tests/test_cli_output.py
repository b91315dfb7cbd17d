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


def test_plan_set_show_versions(tmp_path: Path) -> None:
    """`cutpoint plan set` from a YAML file, `plan show` lists the boot groups
    in order, `plan versions` both versions; a plan that does not parse is
    refused with the API's reason."""
    with api_server(tmp_path) as srv:
        assert srv.cli("group", "create", "g1").returncode == 0
        f = tmp_path / "plan.yaml"
        f.write_text("boot_groups:\n  - name: db\n    vms: [{vm: pg1, delay_s: 5}]\n"
                     "  - name: app\n    vms: [app1]\nnetworks: {drill: cpdrill0}\n")
        r = srv.cli("plan", "set", "g1", str(f))
        assert r.returncode == 0 and "version 1" in r.stdout, r.stderr
        r = srv.cli("plan", "show", "g1")
        assert r.returncode == 0, r.stderr
        rows = [ln.split("\t") for ln in r.stdout.splitlines() if ln[:1].isdigit()]
        assert [(c[0], c[1], c[2], c[3], c[4]) for c in rows] == \
            [("1", "db", "pg1", "guest-ping", "5"), ("2", "app", "app1", "guest-ping", "")]
        f.write_text('{"boot_groups": [{"name": "all", "vms": ["pg1", "app1"]}]}')
        f2 = f.with_suffix(".json")
        f.rename(f2)
        assert "version 2" in srv.cli("plan", "set", "g1", str(f2)).stdout
        vs = json.loads(srv.cli("plan", "versions", "g1", "--json").stdout)
        assert [v["version"] for v in vs] == [2, 1]
        assert json.loads(srv.cli("plan", "show", "g1", "--version", "1", "--json").stdout)[
            "body"]["boot_groups"][0]["name"] == "db"
        f2.write_text('{"boot_groups": [{"vms": []}]}')
        r = srv.cli("plan", "set", "g1", str(f2))
        assert r.returncode == 1 and "bad_plan" in r.stderr, r.stderr
