"""Schemathesis against the live OpenAPI document, with an admin token.

Starts the project's own Redis (services_local), a fresh SQLite database
migrated with Alembic, seeds a site/host/VM/group so that generated ids
sometimes hit real rows, serves the API with uvicorn on a free port, and
runs `schemathesis run` with the check that matters here: no 5xx on any
generated input.  Exit status is schemathesis's.

    python api/tests/tools/run_schemathesis.py [--max-examples N]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from cutpoint.api import services_local
from cutpoint.api.db import session_scope
from cutpoint.api.migrate import upgrade
from cutpoint.api.models import Host, Role, Site
from cutpoint.api.schemas.groups import GroupCreate, MemberAdd
from cutpoint.api.services import groups, inventory, tokens

SECRET = "schemathesis-secret-0123456789"


def seed(url: str) -> str:
    with session_scope(url) as s:
        site = Site(name="primary")
        s.add(site)
        s.flush()
        host = Host(name="h1", site_id=site.id, address="127.0.0.1", port=1)
        s.add(host)
        s.flush()
        inventory.apply(s, host, {"vms": [{"name": "vm1", "state": "running", "disks": [
            {"id": "vm1/disk0", "node": "disk0", "backend": "qcow2", "file": "/x"}]}]})
        g = groups.create(s, GroupCreate(name="g1"))
        groups.add_member(s, g, MemberAdd(vm="vm1"))
        _, tok = tokens.create(s, "schemathesis", Role.admin, SECRET)
    return tok


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--max-examples", type=int, default=25)
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="cp-st-"))
    eps = services_local.start(tmp / "svc", postgres=False)
    db = f"sqlite:///{tmp}/cp.db"
    upgrade(db)
    tok = seed(db)
    port = services_local.free_port()
    env = {**os.environ, "CUTPOINT_DATABASE_URL": db, "CUTPOINT_REDIS_URL": eps.redis_url,
           "CUTPOINT_TOKEN_SECRET": SECRET}
    log = open(tmp / "api.log", "w")  # noqa: SIM115
    api = subprocess.Popen([sys.executable, "-m", "uvicorn", "--factory",
                            "cutpoint.api.app:create_app", "--port", str(port),
                            "--no-access-log"], env=env, stdout=log, stderr=subprocess.STDOUT,
                           start_new_session=True)
    rc = 1
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(100):
            try:
                if httpx.get(base + "/healthz").status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        st = shutil.which("schemathesis") or str(Path(sys.executable).parent / "schemathesis")
        rc = subprocess.call([st, "run", f"{base}/v1/openapi.json",
                              "-H", f"Authorization: Bearer {tok}",
                              "--checks", "not_a_server_error",
                              "--max-examples", str(a.max_examples), "--seed", "1",
                              "--workers", "1", "--warnings", "off"])
        if rc != 0:
            print((tmp / "api.log").read_text()[-6000:], file=sys.stderr)
    finally:
        os.killpg(api.pid, signal.SIGTERM)
        api.wait(20)
        services_local.destroy(tmp / "svc")
        shutil.rmtree(tmp, ignore_errors=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
