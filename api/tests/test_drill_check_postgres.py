"""The `postgres` drill check against a real PostgreSQL (Debian's 15), with
this machine standing in for the guest: what vm.guest_exec would run in
the VM runs here instead (the same argv, as root, `runuser` to the
postgres user), so the check's commands and judgement meet the real
pg_isready, pg_amcheck (Debian's versioned binary: no wrapper on the PATH)
and psql.  A private cluster of its own (services_local.start_postgres
in a temporary directory), stopped afterwards.

- ready, pg_amcheck clean over every database, the query prints what is
  expected: pass;
- the same with another expected result: fail, naming both (negative
  control);
- a port nothing listens on: fail at pg_isready;
- the ledger's primary key index with one leaf page overwritten while the
  cluster was stopped: pg_amcheck fails, and so does the check (last: it
  leaves the cluster damaged).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cutpoint.api import services_local
from cutpoint.coordinator.dr import checks
from cutpoint.coordinator.dr.checks import CheckContext, CheckSpec, DrillVM
from cutpoint.coordinator.dr.guest import ExecResult
from cutpoint.coordinator.dr.site import CephSite


class HereIsTheGuest(CheckContext):
    """guest_exec runs the argv on this machine (the check's code is unchanged)."""

    def guest_exec(self, vm: DrillVM, path: str, args: list[str] | None = None,
                   input: str | None = None, timeout_s: float | None = None) -> Any:
        t0 = time.monotonic()
        r = subprocess.run([path, *(args or [])], input=input, capture_output=True, text=True,
                           timeout=timeout_s or 60, check=False)
        return ExecResult(r.returncode, None, r.stdout, r.stderr, time.monotonic() - t0)


@pytest.fixture(scope="module")
def cluster() -> Iterator[int]:
    if os.geteuid() != 0:
        pytest.skip("runs PostgreSQL as the postgres user (root needed)")
    # not under pytest's tmp (0700 parents): the postgres user must reach it
    state = tempfile.mkdtemp(prefix="cp-pgcheck-")
    port = services_local.free_port()
    services_local.start_postgres(Path(state), port)
    base = ["runuser", "-u", "postgres", "--", "psql", "-h", "127.0.0.1", "-p", str(port),
            "-U", services_local.DB_ROLE, "-d", services_local.DB_NAME, "-v",
            "ON_ERROR_STOP=1", "-c"]
    sql = ("create table ledger(id bigint primary key); insert into ledger "
           "select generate_series(1, 1000)")
    subprocess.run([*base, sql], check=True, capture_output=True)
    try:
        yield port
    finally:
        subprocess.run(["runuser", "-u", "postgres", "--",
                        str(services_local.PG_BIN / "pg_ctl"), "-D",
                        str(Path(state) / "pg" / "data"), "-m", "immediate", "stop"],
                       check=False, capture_output=True)
        shutil.rmtree(state, ignore_errors=True)


def run(port: int, **params: Any) -> dict[str, Any]:
    p = {"host": "127.0.0.1", "port": port, "role": services_local.DB_ROLE,
         "database": services_local.DB_NAME, **params}
    ctx = HereIsTheGuest(CephSite("dr", pools={"rbd": "rbd"},
                                  ceph_conf="/nonexistent/ceph.conf"), [],
                         [DrillVM("drill-x-pg1", "pg1", object())], p, 120, ("a", "b", "c"))
    return checks.run(CheckSpec("postgres", p, 120), ctx)


def test_postgres_check_passes_on_a_sound_cluster(cluster: int) -> None:
    r = run(cluster, query="select count(*) from ledger", expect="1000")
    print(f"\n{r['summary']} in {r['seconds']} s\n{r['output']}")
    assert r["ok"], r
    assert "pg_isready" in r["output"] and "pg_amcheck" in r["output"]
    assert "[exit 0]" in r["output"]


def test_postgres_check_fails_on_the_wrong_answer(cluster: int) -> None:
    r = run(cluster, query="select count(*) from ledger", expect="999")
    assert not r["ok"] and r["summary"] == "the query printed '1000', want '999'", r


def test_postgres_check_fails_when_nothing_listens(cluster: int) -> None:
    r = run(services_local.free_port())
    assert not r["ok"] and r["summary"].startswith("pg_isready exited 2"), r


def test_postgres_check_fails_on_a_corrupt_index(cluster: int) -> None:
    psql = ["runuser", "-u", "postgres", "--", "psql", "-h", "127.0.0.1", "-p", str(cluster),
            "-U", services_local.DB_ROLE, "-d", services_local.DB_NAME, "-AtXc"]
    rel = subprocess.run([*psql, "select pg_relation_filepath('ledger_pkey')"],
                         capture_output=True, text=True, check=True).stdout.strip()
    data = Path(subprocess.run([*psql, "show data_directory"], capture_output=True, text=True,
                               check=True).stdout.strip())
    ctl = ["runuser", "-u", "postgres", "--", str(services_local.PG_BIN / "pg_ctl"), "-D",
           str(data)]
    opts = subprocess.run(["cat", str(data / "postmaster.opts")], capture_output=True,
                          text=True, check=True).stdout
    subprocess.run([*ctl, "-m", "fast", "-w", "stop"], check=True, capture_output=True)
    with open(data / rel, "r+b") as f:  # page 1: the first leaf (page 0 is the metapage)
        f.seek(8192 + 100)
        f.write(b"\xff" * 2000)
    o = opts.split(" ", 1)[1].strip() if " " in opts else ""
    subprocess.run([*ctl, "-l", str(data.parent / "postgres.log"), "-o",
                    o.replace('"', "").replace("-D " + str(data), ""), "-w", "start"],
                   check=True, capture_output=True)
    r = run(cluster)
    print(f"\n{r['summary']}\n{r['output'][-1500:]}")
    assert not r["ok"] and r["summary"].startswith("pg_amcheck --all exited"), r
