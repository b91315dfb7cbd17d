"""`cutpoint site …` against a real API process (SQLite), no Ceph cluster up:
the check refusing a site names the failing step, `--no-check` stores it,
show/list/update print what the API holds, and no key is ever printed."""

from __future__ import annotations

from pathlib import Path

from apiserver import api_server  # api/tests/apiserver.py

KEY = "AQBmDUlnAAAAABAAp9n3yQ4bC4YVb9QkzQ3xYw=="


def test_site_commands_without_a_cluster(tmp_path: Path) -> None:
    kr = tmp_path / "dr.client.cutpoint.keyring"
    kr.write_text(f"[client.cutpoint]\n\tkey = {KEY}\n")
    access = ["--ceph-conf", "/nonexistent/dr.conf", "--keyring", str(kr), "--pool", "rbd"]
    with api_server(tmp_path) as srv:
        outs = []
        r = srv.cli("site", "add", "dr", *access)
        outs.append(r.stdout + r.stderr)
        assert r.returncode == 1, outs[-1]
        assert "site_check_failed" in r.stderr and "connect" in r.stderr
        assert "ceph_not_found" in r.stderr and "/nonexistent/dr.conf" in r.stderr
        assert srv.cli("site", "list", "--json").stdout.strip() == "[]"

        r = srv.cli("site", "add", "dr", *access, "--pool", "db=dr-db", "--no-check",
                    "--description", "the DR site")
        outs.append(r.stdout + r.stderr)
        assert r.returncode == 0, outs[-1]
        assert "client.cutpoint at /nonexistent/dr.conf, pools rbd, db=dr-db" in r.stdout
        assert "check -" in r.stdout

        r = srv.cli("site", "show", "dr")
        outs.append(r.stdout + r.stderr)
        assert r.returncode == 0, outs[-1]
        for line in ("ceph_conf: /nonexistent/dr.conf", "client_id: cutpoint",
                     f"keyring: {kr}", "op_timeout_s: 30", "last check: -"):
            assert line in r.stdout, r.stdout

        r = srv.cli("site", "check", "dr")
        outs.append(r.stdout + r.stderr)
        assert r.returncode == 1 and "connect" in r.stderr and "fail" in r.stderr, outs[-1]
        r = srv.cli("site", "list")
        outs.append(r.stdout + r.stderr)
        assert "failed: connect" in r.stdout, r.stdout

        # A change of the access is checked too: refused, nothing changes.
        r = srv.cli("site", "update", "dr", "--op-timeout", "20")
        outs.append(r.stdout + r.stderr)
        assert r.returncode == 1 and "site_check_failed" in r.stderr, outs[-1]
        r = srv.cli("site", "update", "dr", "--mon-host", "v2:10.0.0.1:3300",
                    "--op-timeout", "20", "--no-check")
        outs.append(r.stdout + r.stderr)
        assert r.returncode == 0 and "at v2:10.0.0.1:3300" in r.stdout, outs[-1]
        r = srv.cli("site", "update", "dr", "--remove-ceph", "--description", "later")
        outs.append(r.stdout + r.stderr)
        assert r.returncode == 0 and "no Ceph access" in r.stdout, outs[-1]

        r = srv.cli("site", "add", "x", "--ceph-conf", "/c", "--mon-host", "m:1", "--pool", "p")
        assert r.returncode == 2 and "not both" in r.stderr, r.stderr
        r = srv.cli("site", "show", "nope")
        assert r.returncode == 1 and "no site named 'nope'" in r.stderr
        outs.append(srv.log())
    for text in outs:
        assert KEY not in text
