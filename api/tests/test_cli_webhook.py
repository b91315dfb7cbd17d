"""`cutpoint webhook …` against a real API process: add, list (complete TSV
off a terminal), events, deliveries, and delete (refused without --yes)."""

from __future__ import annotations

import json
from pathlib import Path

from apiserver import api_server  # api/tests/apiserver.py


def test_webhook_commands(tmp_path: Path) -> None:
    with api_server(tmp_path) as srv:
        r = srv.cli("webhook", "add", "ops", "https://hooks.example/cp", "--event",
                    "drill.finished", "--event", "rpo.breached", "--secret-file",
                    "/etc/cutpoint/hook.secret")
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == ("webhook ops id=1: drill.finished, rpo.breached -> "
                                    "https://hooks.example/cp")
        r = srv.cli("webhook", "add", "bad", "https://x/", "--event", "nope", "--secret-file",
                    "/s")
        assert r.returncode == 1 and "unknown_event" in r.stderr, r.stderr
        lines = srv.cli("webhook", "list").stdout.splitlines()
        assert lines[1].split("\t")[:5] == ["1", "ops", "drill.finished,rpo.breached",
                                           "https://hooks.example/cp",
                                           "/etc/cutpoint/hook.secret"], lines
        assert "failover.finished" in srv.cli("webhook", "events").stdout.split()
        assert json.loads(srv.cli("webhook", "deliveries", "ops", "--json").stdout) == []
        r = srv.cli("webhook", "delete", "ops")
        assert r.returncode == 2 and "pass --yes" in r.stderr, r.stderr
        assert srv.cli("webhook", "delete", "ops", "--yes").returncode == 0
        assert json.loads(srv.cli("webhook", "list", "--json").stdout) == []
