"""Schemathesis against the live OpenAPI document, once per role.

Starts the project's own Redis (services_local), a fresh SQLite database
migrated with Alembic, seeds a site/host/VM/group so that generated ids
sometimes hit real rows, serves the API with uvicorn on a free port, and
runs `schemathesis run` with a token of each role in turn (viewer, operator,
admin: what a role may not do must be refused cleanly too), with two
checks: no 5xx on any generated input (`not_a_server_error`), and every
response with a documented status matches its documented schema
(`response_schema_conformance`).  It prints, per role, the test cases
generated and passed, and exits non-zero if any role's run failed.

    python api/tests/tools/run_schemathesis.py [--max-examples N] [--roles viewer,admin]
"""

from __future__ import annotations

import argparse
import os
import re
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
CHECKS = "not_a_server_error,response_schema_conformance,content_type_conformance,status_code_conformance"
ROLES = ("viewer", "operator", "admin")


def seed(url: str) -> dict[str, str]:
    """Rows for generated ids to hit, and one token per role."""
    with session_scope(url) as s:
        site = Site(name="primary")
        s.add(site)
        s.flush()
        host = Host(name="h1", site_id=site.id, address="127.0.0.1", port=1,
                    cert_fingerprint="0f" * 32)
        s.add(host)
        s.flush()
        inventory.apply(s, host, {"vms": [{"name": "vm1", "state": "running", "disks": [
            {"id": "vm1/disk0", "node": "disk0", "backend": "qcow2", "file": "/x"}]}]})
        g = groups.create(s, GroupCreate(name="g1"))
        groups.add_member(s, g, MemberAdd(vm="vm1"))
        out = {}
        for role in ROLES:
            _, out[role] = tokens.create(s, f"schemathesis-{role}", Role(role), SECRET)
    return out


def figures(output: str) -> tuple[int, int, int]:
    """(generated, passed, failed) test cases from schemathesis's summary:
    "N generated, N passed" or "N generated, F found U unique failures"."""
    m = re.search(r"(\d+) generated, (\d+) passed", output)
    if m is not None:
        return int(m.group(1)), int(m.group(2)), 0
    m = re.search(r"(\d+) generated, (\d+) found", output)
    if m is not None:
        gen, bad = int(m.group(1)), int(m.group(2))
        return gen, gen - bad, bad
    return 0, 0, 0


def run_role(st: str, base: str, role: str, token: str, max_examples: int) -> tuple[int, str]:
    p = subprocess.Popen([st, "run", f"{base}/v1/openapi.json",
                          "-H", f"Authorization: Bearer {token}",
                          "--checks", CHECKS, "--max-examples", str(max_examples),
                          "--seed", "1", "--workers", "1", "--warnings", "off"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert p.stdout is not None
    lines = []
    for line in p.stdout:
        sys.stdout.write(line)
        lines.append(line)
    return p.wait(), "".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--max-examples", type=int, default=20)
    ap.add_argument("--roles", default=",".join(ROLES))
    a = ap.parse_args()
    roles = [r for r in a.roles.split(",") if r]
    tmp = Path(tempfile.mkdtemp(prefix="cp-st-"))
    eps = services_local.start(tmp / "svc", postgres=False)
    db = f"sqlite:///{tmp}/cp.db"
    upgrade(db)
    toks = seed(db)
    port = services_local.free_port()
    env = {**os.environ, "CUTPOINT_DATABASE_URL": db, "CUTPOINT_REDIS_URL": eps.redis_url,
           "CUTPOINT_TOKEN_SECRET": SECRET}
    log = open(tmp / "api.log", "w")  # noqa: SIM115
    api = subprocess.Popen([sys.executable, "-m", "uvicorn", "--factory",
                            "cutpoint.api.app:create_app", "--port", str(port),
                            "--no-access-log"], env=env, stdout=log, stderr=subprocess.STDOUT,
                           start_new_session=True)
    rows = []
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(100):
            try:
                if httpx.get(base + "/healthz").status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        st = shutil.which("schemathesis") or str(Path(sys.executable).parent / "schemathesis")
        for role in roles:
            print(f"\n=== schemathesis as {role} (checks {CHECKS}, --max-examples "
                  f"{a.max_examples})", flush=True)
            t0 = time.monotonic()
            rc, out = run_role(st, base, role, toks[role], a.max_examples)
            rows.append((role, rc, *figures(out), time.monotonic() - t0))
        if any(r[1] != 0 for r in rows):
            print((tmp / "api.log").read_text()[-6000:], file=sys.stderr)
    finally:
        os.killpg(api.pid, signal.SIGTERM)
        api.wait(20)
        services_local.destroy(tmp / "svc")
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"\nschemathesis, --max-examples {a.max_examples}, checks {CHECKS}")
    print(f"{'role':<9} {'generated':>9} {'passed':>7} {'failed':>7} {'seconds':>8}  result")
    for role, rc, gen, ok, bad, secs in rows:
        print(f"{role:<9} {gen:>9} {ok:>7} {bad:>7} {secs:>8.1f}  {'ok' if rc == 0 else 'FAILED'}")
    return 0 if rows and all(r[1] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
