"""Drill checks with a context (coordinator/dr/checks.py, checks_builtin.py),
without a drill: the control-side checks against real local servers and
programs, a check's timeout, the older two-argument form, the parameter
errors; the in-guest checks' parsing where it can be shown here."""

from __future__ import annotations

import http.server
import os
import socket
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cutpoint.coordinator.dr import checks
from cutpoint.coordinator.dr.checks import CheckContext, CheckError, CheckSpec, DrillVM
from cutpoint.coordinator.dr.checks_builtin import nodetool_states
from cutpoint.coordinator.dr.site import CephSite, ImageRef

SITE = CephSite("dr", pools={"rbd": "rbd"}, ceph_conf="/nonexistent/ceph.conf")


def ctx(params: dict, timeout_s: float = 10, vms: list[DrillVM] | None = None) -> CheckContext:
    return CheckContext(SITE, [ImageRef("rbd", "drill-x-vm1-disk0")], vms or [], params,
                        timeout_s, drill_id="x")


def run(name: str, params: dict, timeout_s: float = 10) -> dict:
    return checks.run(CheckSpec(name, params, timeout_s), ctx(params, timeout_s))


def test_builtins_are_known() -> None:
    assert {"writer", "guest-exec", "tcp", "http", "script", "postgres",
            "cassandra"} <= set(checks.known())


def test_specs_parse() -> None:
    assert CheckSpec.parse("writer") == CheckSpec("writer")
    assert CheckSpec.parse({"name": "tcp", "params": {"port": 1}, "timeout_s": 5}) == \
        CheckSpec("tcp", {"port": 1}, 5.0)
    for bad, why in (({"name": "x", "timeout_s": 0}, "timeout_s"),
                     ({"name": "x", "param": {}}, "unknown key"),
                     ({"name": "x", "params": []}, "params is an object"),
                     (5, "a name or")):
        with pytest.raises(CheckError, match=why):
            CheckSpec.parse(bad)  # type: ignore[arg-type]


@pytest.fixture
def web() -> Iterator[int]:
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            code = 200 if self.path == "/ok" else 503
            body = b"db: open\n" if code == 200 else b"down\n"
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a: object) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    yield srv.server_address[1]
    srv.shutdown()


def test_http(web: int) -> None:
    r = run("http", {"url": f"http://127.0.0.1:{web}/ok", "regex": "^db: open$"})
    assert r["ok"] and r["summary"] == f"GET http://127.0.0.1:{web}/ok: 200", r
    assert "db: open" in r["output"]
    r = run("http", {"url": f"http://127.0.0.1:{web}/down"})
    assert not r["ok"] and "status 503, want 200" in r["summary"]
    r = run("http", {"url": f"http://127.0.0.1:{web}/ok", "regex": "closed"})
    assert not r["ok"] and "does not match" in r["summary"]


def test_tcp(web: int) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    r = run("tcp", {"targets": [{"address": "127.0.0.1", "port": web},
                                {"address": "127.0.0.1", "port": closed}]})
    assert not r["ok"] and r["summary"] == f"127.0.0.1:{closed} not open"
    assert run("tcp", {"address": "127.0.0.1", "port": web})["ok"]
    r = run("tcp", {"address": "127.0.0.1"})
    assert not r["ok"] and "needs address and port" in r["summary"]


def test_script_gets_the_drill_and_its_exit_code_decides(tmp_path: Path) -> None:
    sh = tmp_path / "check.sh"
    sh.write_text("#!/bin/sh\necho \"drill=$CP_DRILL_ID vms=$CP_DRILL_VMS arg=$1\"\n"
                  "exit \"$1\"\n")
    sh.chmod(sh.stat().st_mode | stat.S_IXUSR)
    r = run("script", {"path": str(sh), "args": ["0"]})
    assert r["ok"] and "drill=x vms={} arg=0" in r["output"], r
    r = run("script", {"path": str(sh), "args": ["3"]})
    assert not r["ok"] and r["summary"].endswith("exited 3")
    r = run("script", {"path": str(tmp_path / "nope")})
    assert not r["ok"] and "No such file" in r["summary"]


def test_a_check_past_its_timeout_fails(tmp_path: Path) -> None:
    def slow(c: CheckContext) -> dict:
        time.sleep(5)
        return {"ok": True, "summary": "late"}

    checks.register("slow-test", slow)
    t0 = time.monotonic()
    r = checks.run(CheckSpec("slow-test", {}, 0.5), ctx({}))
    assert not r["ok"] and r["summary"].startswith("timed out after"), r
    assert time.monotonic() - t0 < 3


def test_the_two_argument_form_is_still_called() -> None:
    seen = {}

    def old(site: CephSite, images: list[ImageRef]) -> dict:
        seen["args"] = (site.name, [i.image for i in images])
        return {"ok": True, "summary": "old form"}

    checks.register("old-form-test", old)
    assert checks.run(CheckSpec("old-form-test"), ctx({}))["ok"]
    assert seen["args"] == ("dr", ["drill-x-vm1-disk0"])


def test_in_guest_checks_need_an_agent() -> None:
    vm = DrillVM("drill-x-vm1", "vm1", None)
    r = checks.run(CheckSpec("guest-exec", {"path": "/bin/true"}),
                   ctx({"path": "/bin/true"}, vms=[vm]))
    assert not r["ok"] and "not reachable through an agent" in r["summary"]
    r = checks.run(CheckSpec("guest-exec", {"path": "/bin/true", "vm": "vm9"}),
                   ctx({"path": "/bin/true", "vm": "vm9"}, vms=[vm]))
    assert not r["ok"] and "no drill VM 'vm9'" in r["summary"]
    r = checks.run(CheckSpec("guest-exec", {}), ctx({}, vms=[vm]))
    assert not r["ok"] and "params.path is required" in r["summary"]


def test_nodetool_status_states() -> None:
    """The layout of `nodetool status` (Cassandra 5.0; written from its
    documented format, not recorded here): the state is the first column of
    each node's line."""
    text = ("Datacenter: datacenter1\n=======================\n"
            "Status=Up/Down\n|/ State=Normal/Leaving/Joining/Moving\n"
            "--  Address       Load        Tokens  Owns (effective)  Host ID"
            "                               Rack\n"
            "UN  10.77.101.1   104.3 KiB   16      100.0%            "
            "6f1f0c8e-7a7c-4b5e-9d6a-1c2b3d4e5f60  rack1\n"
            "DN  10.77.101.2   98.1 KiB    16      100.0%            "
            "0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d  rack1\n")
    assert nodetool_states(text) == {"10.77.101.1": "UN", "10.77.101.2": "DN"}
    assert nodetool_states("nodetool: Failed to connect\n") == {}


def test_reading_addresses_parses_ip_output() -> None:
    class Fake(CheckContext):
        def guest_exec(self, vm, path, args=None, input=None, timeout_s=None):  # type: ignore[override]
            from cutpoint.coordinator.dr.guest import ExecResult

            return ExecResult(0, None, "2: eth0    inet 10.99.0.11/24 scope global eth0\\"
                              "       valid_lft forever\n3: eth1    inet 10.99.1.5/16 brd "
                              "10.99.255.255 scope global eth1\n", "", 0.01)

    c = Fake(SITE, [], [DrillVM("d-vm1", "vm1", object())], tls=("a", "b", "c"))
    assert c.addresses(c.vms[0]) == ["10.99.0.11", "10.99.1.5"]
    assert os.environ.get("CP_DRILL_ID") is None


def test_writer_reads_the_recovery_point_not_the_clones(monkeypatch: pytest.MonkeyPatch) -> None:
    """A copy booted from its definition runs its writer on its clone before
    the check reads it (make demo, 2026-11-27: `records of 2 runs`), so the
    writer check reads the DR snapshots the clones were made from; without
    them (a context of images only) it reads the images."""
    from cutpoint.coordinator.dr import writer_records

    read: list[list[str]] = []

    class Verdict:
        ok = True

        def summary(self) -> str:
            return "OK"

        def as_dict(self) -> dict:
            return {}

    def scan(specs: list) -> Verdict:
        read.append([str(s.ref) for s in specs])
        return Verdict()

    monkeypatch.setattr(writer_records, "scan_specs", scan)
    c = ctx({})
    c.points = [ImageRef("rbd", "vm1-disk0", "cp.g.t1")]
    assert checks.run(CheckSpec("writer", {}, 10), c)["ok"]
    assert checks.run(CheckSpec("writer", {}, 10), ctx({}))["ok"]
    assert read == [["rbd/vm1-disk0@cp.g.t1"], ["rbd/drill-x-vm1-disk0"]]
