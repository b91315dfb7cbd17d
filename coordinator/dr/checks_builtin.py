"""The built-in drill checks beside `writer` (checks.py says what a check is).

In the guest, through its agent's vm.guest_exec (qemu-guest-agent):

    guest-exec  {path, args?, input?, exit_code?: 0, regex?, vm?|vms?}
                the program's exit code must be exit_code and, with regex,
                its stdout must match it (re.search, multiline), on each
                selected VM (params vm / vms; default every VM)
    postgres    {vm?, user?: "postgres", host?, port?, role?, query?,
                 expect?, database?}
                pg_isready exits 0; `pg_amcheck --all --install-missing
                --heapallindexed` (every database; Debian's versioned
                binary when none is on the PATH) exits 0; with query, `psql
                -AtX -c query` prints exactly expect (stripped); all run as
                the OS user `user` (runuser), host/port/role passed to each
    cassandra   {vm?, nodetool?: "nodetool", cqlsh?: "cqlsh", query?, expect?}
                every node of `nodetool status` is UN (up, normal); with
                query, `cqlsh -e query` prints something that matches the
                regex expect

From the control plane, where the drill network is reachable (the worker
runs on a host with an address on the drill bridge, or a route to it: see
docs/drills.md, "Probing the drill network"):

    tcp         {address, port} or {targets: [{address, port}, ...]}
                each connects within the check's timeout
    http        {url, status?: 200, regex?}
                a GET answers with that status (and body matching regex)
    script      {path, args?}
                runs on the control side (no shell) with CP_DRILL_ID,
                CP_DRILL_VMS (JSON: each VM's drill name, group VM and its
                addresses as its guest reports them) in its environment;
                exit 0 passes

Each returns its output (`output`: what ran and what it printed) for the
report.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import urllib.error
import urllib.request
from typing import Any

from cutpoint.coordinator.dr.checks import CheckContext, CheckError, DrillVM

OUTPUT_MAX = 8192  # characters of each program's output kept in the report


def _cut(s: str) -> str:
    return s if len(s) <= OUTPUT_MAX else s[:OUTPUT_MAX] + f"... ({len(s)} characters)"


def _need(params: dict[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
    v = params.get(key)
    if not isinstance(v, kind) or v == "":
        raise CheckError(f"params.{key} is required ({getattr(kind, '__name__', kind)})")
    return v


def _run(ctx: CheckContext, vm: DrillVM, argv: list[str], input: str | None = None) \
        -> tuple[Any, str]:
    r = ctx.guest_exec(vm, argv[0], argv[1:], input)
    line = (f"[{vm.original}] $ {shlex.join(argv)}\n{r.stdout}"
            + (f"[stderr] {r.stderr}" if r.stderr else "")
            + f"[exit {r.exitcode}{f', signal {r.signal}' if r.signal else ''}]")
    return r, line


def guest_exec(ctx: CheckContext) -> dict[str, Any]:
    p = ctx.params
    path = _need(p, "path", str)
    args = [str(a) for a in p.get("args") or []]
    want = int(p.get("exit_code", 0))
    regex = re.compile(p["regex"], re.MULTILINE) if p.get("regex") else None
    out, bad = [], []
    for vm in ctx.selected():
        r, line = _run(ctx, vm, [path, *args], p.get("input"))
        out.append(line)
        if r.exitcode != want:
            bad.append(f"{vm.original}: exit {r.exitcode}, want {want}")
        elif regex and not regex.search(r.stdout):
            bad.append(f"{vm.original}: output does not match /{regex.pattern}/")
    return {"ok": not bad, "summary": "; ".join(bad) or
            f"{path} exited {want}{' and matched' if regex else ''} on "
            f"{len(out)} VM(s)", "output": _cut("\n".join(out))}


# Debian's PATH wrappers (postgresql-common) do not cover pg_amcheck: the
# versioned binary is used when none is on the PATH.
PG_AMCHECK = ('p=$(command -v pg_amcheck || ls /usr/lib/postgresql/*/bin/pg_amcheck '
              '2>/dev/null | sort -V | tail -n 1); [ -n "$p" ] || '
              '{ echo "pg_amcheck: not installed" >&2; exit 127; }; exec "$p" "$@"')


def postgres(ctx: CheckContext) -> dict[str, Any]:
    p = ctx.params
    vm = ctx.vm(p.get("vm"))
    as_user = ["runuser", "-u", str(p.get("user") or "postgres"), "--"]
    conn: list[str] = []
    for key, flag in (("host", "-h"), ("port", "-p"), ("role", "-U")):
        if p.get(key) is not None:
            conn += [flag, str(p[key])]
    out, bad = [], []
    r, line = _run(ctx, vm, [*as_user, "pg_isready", *conn])
    out.append(line)
    if r.exitcode != 0:
        bad.append(f"pg_isready exited {r.exitcode}")
    else:
        # every database; --install-missing creates the amcheck extension
        # where it is not (this writes only to the drill's copy)
        r, line = _run(ctx, vm, [*as_user, "/bin/sh", "-c", PG_AMCHECK, "pg_amcheck",
                                 *conn, "--all", "--install-missing", "--heapallindexed"])
        out.append(line)
        if r.exitcode != 0:
            bad.append(f"pg_amcheck --all exited {r.exitcode}")
        if p.get("query"):
            argv = [*as_user, "psql", *conn, "-AtX", "-v", "ON_ERROR_STOP=1"]
            if p.get("database"):
                argv += ["-d", str(p["database"])]
            r, line = _run(ctx, vm, [*argv, "-c", str(p["query"])])
            out.append(line)
            got = r.stdout.strip()
            if r.exitcode != 0:
                bad.append(f"the query failed (exit {r.exitcode})")
            elif "expect" in p and got != str(p["expect"]).strip():
                bad.append(f"the query printed {got!r}, want {str(p['expect']).strip()!r}")
    return {"ok": not bad, "summary": "; ".join(bad) or
            f"PostgreSQL on {vm.original}: ready, pg_amcheck clean"
            + (", query as expected" if p.get("query") else ""),
            "output": _cut("\n".join(out))}


STATUS_LINE = re.compile(r"^([UD][NLJM])\s+(\S+)", re.MULTILINE)


def nodetool_states(text: str) -> dict[str, str]:
    """`nodetool status` output -> {address: state} (UN, DN, UJ, ...)."""
    return {m.group(2): m.group(1) for m in STATUS_LINE.finditer(text)}


def cassandra(ctx: CheckContext) -> dict[str, Any]:
    p = ctx.params
    vm = ctx.vm(p.get("vm"))
    out, bad = [], []
    r, line = _run(ctx, vm, [str(p.get("nodetool") or "nodetool"), "status"])
    out.append(line)
    states = nodetool_states(r.stdout)
    if r.exitcode != 0:
        bad.append(f"nodetool status exited {r.exitcode}")
    elif not states:
        bad.append("nodetool status listed no node")
    elif any(s != "UN" for s in states.values()):
        bad.append("not all nodes UN: " + ", ".join(f"{a} {s}" for a, s in
                                                     sorted(states.items()) if s != "UN"))
    if not bad and p.get("query"):
        r, line = _run(ctx, vm, [str(p.get("cqlsh") or "cqlsh"), "-e", str(p["query"])])
        out.append(line)
        if r.exitcode != 0:
            bad.append(f"cqlsh exited {r.exitcode}")
        elif p.get("expect") and not re.search(str(p["expect"]), r.stdout, re.MULTILINE):
            bad.append(f"the query's output does not match /{p['expect']}/")
    return {"ok": not bad, "summary": "; ".join(bad) or
            f"Cassandra: {len(states)} node(s) UN"
            + (", query as expected" if p.get("query") else ""),
            "nodes": states, "output": _cut("\n".join(out))}


def tcp(ctx: CheckContext) -> dict[str, Any]:
    from cutpoint.coordinator.dr.readiness import tcp_open

    p = ctx.params
    targets = p.get("targets") or [{"address": p.get("address"), "port": p.get("port")}]
    out, bad = [], []
    for t in targets:
        addr, port = t.get("address"), t.get("port")
        if not addr or not isinstance(port, int):
            raise CheckError("tcp needs address and port (or targets: [{address, port}])")
        ok = tcp_open(str(addr), port, min(ctx.timeout_s, 10))
        out.append(f"tcp {addr}:{port} {'open' if ok else 'not open'}")
        if not ok:
            bad.append(f"{addr}:{port} not open")
    return {"ok": not bad, "summary": "; ".join(bad) or f"{len(out)} port(s) open",
            "output": "\n".join(out)}


def http(ctx: CheckContext) -> dict[str, Any]:
    p = ctx.params
    url = _need(p, "url", str)
    want = int(p.get("status", 200))
    try:
        with urllib.request.urlopen(url, timeout=min(ctx.timeout_s, 30)) as resp:
            status, body = resp.status, resp.read(1 << 20).decode(errors="replace")
    except urllib.error.HTTPError as exc:
        status, body = exc.code, exc.read(1 << 20).decode(errors="replace")
    except (urllib.error.URLError, OSError) as exc:
        return {"ok": False, "summary": f"GET {url}: {exc}", "output": f"GET {url}: {exc}"}
    bad = []
    if status != want:
        bad.append(f"status {status}, want {want}")
    if p.get("regex") and not re.search(str(p["regex"]), body, re.MULTILINE):
        bad.append(f"the body does not match /{p['regex']}/")
    return {"ok": not bad, "summary": "; ".join(bad) or f"GET {url}: {status}",
            "output": _cut(f"GET {url} -> {status}\n{body}")}


def script(ctx: CheckContext) -> dict[str, Any]:
    p = ctx.params
    path = _need(p, "path", str)
    vms = {v.original: {"name": v.name, "addresses": ctx.addresses(v)
                        if v.agent is not None else []} for v in ctx.vms}
    env = {**os.environ, "CP_DRILL_ID": ctx.drill_id, "CP_DRILL_VMS": json.dumps(vms)}
    argv = [path, *[str(a) for a in p.get("args") or []]]
    try:
        r = subprocess.run(argv, env=env, capture_output=True, text=True,
                           timeout=ctx.timeout_s, stdin=subprocess.DEVNULL, check=False)
    except subprocess.TimeoutExpired:
        return {"ok": False, "summary": f"{path}: still running after {ctx.timeout_s:.0f} s "
                f"(killed)", "output": ""}
    except OSError as exc:
        return {"ok": False, "summary": f"{path}: {exc}", "output": ""}
    return {"ok": r.returncode == 0, "summary": f"{path} exited {r.returncode}",
            "vms": vms, "output": _cut(f"$ {shlex.join(argv)}\n{r.stdout}"
                                       + (f"[stderr] {r.stderr}" if r.stderr else ""))}


BUILTIN = {"guest-exec": guest_exec, "postgres": postgres, "cassandra": cassandra,
           "tcp": tcp, "http": http, "script": script}
