"""`cutpoint-lab demo`: the control plane on the lab, everything through the API.

    cutpoint-lab demo [--seconds 60] [--rpo 10]

Holds the lab lock for the whole run, then: lab up in libvirt mode (2
primary hosts x 1 libvirt domain x 2 RBD disks behind a cephx secret,
workload `writer`), one agent per host (the libvirt driver; the DR host's
lists no standby), an isolated drill bridge on the DR host, `cutpoint
server --embedded` with the product's booter (CUTPOINT_BOOTER=agent, the
lab's definition signing key, the DR site's definition target), register
the lab's two sites with their Ceph access as the control plane's cephx
client `client.cutpoint` (`cutpoint site add`, checked by the API) and the
three hosts (inventory sync), create a group of the 2 VMs on 2 hosts with
a 10 s RPO replicated to site `dr`, let the scheduler take snapshots for
about a minute, show the snapshots and the RPO status, check the newest
snapshot with the writer checker and the domains' libvirt logs for a
`tainted` line, show the definitions the inventory watch captured, run a
drill at DR (`cutpoint drill run --plan`: clones of the recovery point's
DR images, the captured definitions rewritten for the drill bridge,
signed and started by the DR agent, ready by guest-ping; the writer check
on the clones and a guest-exec check in each copy), check that nothing
of the drill is left, and tear everything down.
Every step prints the command it runs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import typer

EXE = str(Path(sys.executable).with_name("cutpoint"))
LAB_EXE = str(Path(sys.executable).with_name("cutpoint-lab"))


def say(msg: str) -> None:
    print(f"\n==> {msg}", flush=True)


def cp(*args: str, env: dict[str, str] | None = None, check: bool = True,
       capture: bool = False, exe: str = EXE) -> str:
    """Run `cutpoint ARGS` (or, with exe=LAB_EXE, `cutpoint-lab ARGS`), showing it."""
    name = Path(exe).name
    print(f"$ {name} " + " ".join(args), flush=True)
    r = subprocess.run([exe, *args], env=env, check=False, text=True,
                       capture_output=capture)
    if capture:
        print(r.stdout, end="", flush=True)
        if r.stderr:
            print(r.stderr, end="", file=sys.stderr, flush=True)
    if check and r.returncode != 0:
        raise SystemExit(f"demo: `{name} {' '.join(args)}` failed with {r.returncode}")
    return r.stdout if capture else ""


def start_server(state: Path, certs: Path, port: int = 18470, show: bool = True,
                 booter: str = "lab", settings: dict[str, str] | None = None) \
        -> tuple[subprocess.Popen[bytes], dict[str, str]]:
    """`cutpoint server --embedded` with `booter` (the lab's by default) and
    `settings` (CUTPOINT_* variables), its state under `state`; returns it
    once ready, and the environment (CUTPOINT_URL, CUTPOINT_TOKEN: the admin
    token it wrote) for `cutpoint` commands.  Unless `show`, its log goes
    to `state`/server.log, not our output."""
    token_file = state / "admin.token"
    if show:
        print(f"$ CUTPOINT_BOOTER={booter} cutpoint server --embedded --state-dir "
              f"{state / 'server'} --port {port} --agent-certs {certs} "
              f"--admin-token-file {token_file}")
    with open(os.devnull if show else state / "server.log", "ab") as log:
        server = subprocess.Popen(
            [EXE, "server", "--embedded", "--state-dir", str(state / "server"),
             "--port", str(port), "--agent-certs", str(certs),
             "--admin-token-file", str(token_file)], start_new_session=True,
            env={**os.environ, **(settings or {}), "CUTPOINT_BOOTER": booter},
            stdout=None if show else log, stderr=None if show else log)
    env = {**os.environ, "CUTPOINT_URL": f"http://127.0.0.1:{port}"}
    for _ in range(120):
        if server.poll() is not None:
            raise SystemExit(f"cutpoint server --embedded exited with {server.returncode}"
                             + ("" if show else f"; see {state / 'server.log'}"))
        if token_file.exists():
            try:
                import httpx

                if httpx.get(env["CUTPOINT_URL"] + "/readyz").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
        time.sleep(0.5)
    env["CUTPOINT_TOKEN"] = token_file.read_text().strip()
    return server, env


DRILL_NETWORK = "cpdrill0"


def drill_network(netns: str) -> None:
    """A bridge with no uplink in the DR host's namespace: where a drill's
    copies are plugged (the DR site's drill_network)."""
    subprocess.run(["ip", "-n", netns, "link", "del", DRILL_NETWORK], check=False,
                   capture_output=True)
    for cmd in (["link", "add", DRILL_NETWORK, "type", "bridge"],
                ["link", "set", DRILL_NETWORK, "up"]):
        subprocess.run(["ip", "-n", netns, *cmd], check=True)


def drill_leftovers(status: dict[str, Any], dr_host: dict[str, Any],
                    drill_id: str) -> dict[str, list[str]]:
    """What of drill `drill_id` is left on the DR host: domains and taps."""
    from cutpoint.lab import domains

    tag = f"drill-{drill_id}"
    doms = (domains.host_of(status, dr_host["name"]).virsh("list", "--all", "--name") or "")
    out = subprocess.run(["ip", "-n", dr_host["netns"], "-o", "link", "show", "master",
                          DRILL_NETWORK], check=False, capture_output=True, text=True).stdout
    return {"domains": [n for n in doms.split() if n.startswith(tag)],
            "taps": [ln.split(":")[1].strip() for ln in out.splitlines() if ":" in ln]}


def dr_steps(env: dict[str, str], status: dict[str, Any], dr_host: dict[str, Any]) -> None:
    """Every committed snapshot is replicated to site dr; end with a
    replicated recovery point, a drill at DR that passes (the writer check
    on the clones, a guest-exec check in each booted copy), nothing of it
    left, and its report."""
    say("replication to the DR site: state per group snapshot and member")
    for _ in range(240):
        doc = json.loads(cp("dr", "status", "demo", "--json", env=env, capture=True))
        if doc["newest_recovery_point"]:
            break
        time.sleep(1)
    else:
        raise SystemExit("demo: no DR recovery point after 240 s")
    cp("dr", "status", "demo", "--limit", "5", env=env)
    say(f"a drill of the newest DR recovery point ({doc['newest_recovery_point']}) at DR")
    plan = Path(tempfile.mkdtemp(prefix="cutpoint-demo-plan-")) / "plan.json"
    plan.write_text(json.dumps({"boot_groups": [{"name": "all", "vms": [
        v["name"] for v in status["vms"] if v["site"] == "primary"]}],
        "drill_checks": ["writer", {"name": "guest-exec", "params": {
            "path": "/bin/sh", "args": ["-c", "uname -r; cat /proc/uptime"],
            "regex": "[0-9]+[.][0-9]+ "}}]}, indent=1))
    print(f"$ cat {plan}\n{plan.read_text()}")
    out = cp("drill", "run", "demo", "--plan", str(plan), "--json", env=env, capture=True)
    job = json.loads(out)
    report = job.get("result") or {}
    cp("dr", "status", "demo", "--limit", "3", env=env)
    if job["state"] != "succeeded":
        raise SystemExit(f"demo: the drill failed: {job.get('error')}")
    for chk in report.get("checks") or []:
        print(f"check {chk['name']}: {'pass' if chk['ok'] else 'FAIL'}: {chk['summary']}")
    left = drill_leftovers(status, dr_host, str(report["drill_id"]))
    print(f"left of the drill on {dr_host['name']}: {left}; clones: "
          f"{(report.get('cleanup') or {}).get('leftovers')}")
    if any(left.values()) or not (report.get("cleanup") or {}).get("ok"):
        raise SystemExit(f"demo: the drill left {left}, cleanup {report.get('cleanup')}")
    say(f"drill {report['drill_id']} PASSED; report: {report['report_html']} "
        f"(JSON {report['report_json']})")
    DR_RESULT.update(recovery_point=doc["newest_recovery_point"], report=report["report_html"])


DR_RESULT: dict[str, str] = {}


def no_taint(status: dict[str, Any], offsets: dict[str, int]) -> None:
    """Every domain's libvirt log since the lab came up: no `tainted` line
    (the libvirt driver uses libvirt's native API only)."""
    from cutpoint.lab import domains

    say("the domains' libvirt logs after the snapshots: any `tainted` line?")
    bad = 0
    for vm in status["vms"]:
        lines = domains.tainted(vm, offsets[vm["name"]])
        bad += len(lines)
        print(f"  {vm['domain_log']}: {len(lines)} tainted line(s)"
              + (f": {lines[0].strip()}" if lines else ""))
    if bad:
        raise SystemExit("demo: a domain was tainted")


def _interrupted(signum: int, _frame: object) -> None:
    raise SystemExit(f"demo: interrupted by signal {signum}; cleaning up")


def demo(
    seconds: int = typer.Option(60, "--seconds", min=1,
                                help="how long the scheduler takes snapshots"),
    rpo: int = typer.Option(10, "--rpo", min=1, help="the group's RPO, seconds"),
) -> None:
    """The demo of `make demo`: a replicated group on its RPO, then a drill at DR."""
    raise typer.Exit(run(seconds, rpo))


def run(seconds: int, rpo: int) -> int:
    # SIGTERM (a CI timeout, `kill`) would end Python without running the
    # `finally` below and leave the server, its worker and the lab behind.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _interrupted)
    from cutpoint.lab import domains, lock
    from cutpoint.lab.agents import start_agents, stop_agents
    from cutpoint.lab.sites import cli_args
    from cutpoint.lab.status import load_status

    server: subprocess.Popen[bytes] | None = None
    status = None
    with lock.lab_lock(wait=True, log=print):
        state = Path(tempfile.mkdtemp(prefix="cutpoint-demo-"))
        try:
            say("lab up: 2 primary hosts x 1 libvirt domain x 2 RBD disks, workload writer")
            cp("up", "--driver", "libvirt", "--hosts", "2", "--vms-per-host", "1",
               "--disks", "2", "--workload", "writer", exe=LAB_EXE)
            status = load_status()
            offsets = domains.log_offsets(status["vms"])
            certs = Path(status["state_dir"]) / "certs"
            say("one agent (cutpointd) per lab host; the DR host's lists no standby "
                "(a drill boots the captured definitions there)")
            for rec in start_agents(status, certs, standby=False):
                print(f"agent {rec['host']} at {rec['address']}:{rec['port']} pid {rec['pid']}")
            lv = status["libvirt"]
            target = dict(lv["definition_targets"]["dr"], drill_network=DRILL_NETWORK)
            dr_host = next(h for h in status["hosts"] if h["name"] == target["host"])
            say(f"the isolated drill network: bridge {DRILL_NETWORK} on {dr_host['name']}, "
                "no uplink, no route to production")
            drill_network(dr_host["netns"])
            say("cutpoint server --embedded (API + worker + beat, SQLite, its own Redis), "
                "with the product's booter: drills start the captured definitions "
                "through the DR agent")
            server, env = start_server(state, certs, booter="agent", settings={
                "CUTPOINT_DEFINITION_SIGNING_KEY": str(lv["signing_key"]),
                "CUTPOINT_DEFINITION_TARGETS": json.dumps({"dr": target})})
            say("register the sites with their Ceph access (client.cutpoint, not admin; "
                "the API runs the site check first) and the hosts (each pulls its "
                "agent's inventory)")
            cp("site", "add", "primary", *cli_args(status, "primary"), env=env)
            cp("site", "add", "dr", *cli_args(status, "dr"), env=env)  # the replication target
            cp("site", "list", env=env)
            for h in status["hosts"]:
                cp("host", "add", h["name"], "--site", h["site"], "--address",
                   h["address"], "--cert", str(certs / f"{h['name']}.pem"), env=env)
            cp("host", "list", env=env)
            say(f"a group of the 2 VMs on 2 hosts, RPO {rpo} s")
            cp("group", "create", "demo", "--rpo", str(rpo), "--lease-ms", "3000",
               "--pause-budget-ms", "2000", "--keep-last", "100",
               "--replication-target", "dr", env=env)
            for vm in status["vms"]:
                if vm["site"] == "primary":
                    cp("group", "add-vm", "demo", vm["name"], env=env)
            cp("group", "show", "demo", env=env)
            say(f"the scheduler takes snapshots for {seconds} s")
            t_end = time.monotonic() + seconds
            while time.monotonic() < t_end:
                time.sleep(min(15, max(0.0, t_end - time.monotonic())))
                cp("rpo", "status", "demo", env=env)
            say("snapshots and RPO status")
            cp("group", "snapshots", "demo", "--limit", "50", env=env)
            cp("rpo", "status", "demo", env=env)
            snaps = json.loads(cp("group", "snapshots", "demo", "--json", env=env,
                                  capture=True))
            newest = next(s for s in snaps if s["state"] == "committed")
            say(f"check the newest snapshot ({newest['txn']}) with the writer checker")
            cp("check", "writer", "--group-snapshot", newest["txn"], "--db",
               f"sqlite:///{state / 'server' / 'cutpoint.db'}", env=env, exe=LAB_EXE)
            cp("group", "snapshot-show", str(newest["id"]), env=env)
            no_taint(status, offsets)
            say("the members' definitions, captured from libvirt by the inventory watch")
            for vm in status["vms"]:
                if vm["site"] == "primary":
                    cp("vm", "show", vm["name"], "--host", vm["host"], env=env)
            dr_steps(env, status, dr_host)
        finally:
            say("tear down: server, agents, lab")
            if server is not None and server.poll() is None:
                os.killpg(server.pid, signal.SIGTERM)
                server.wait(60)
            if status is not None:
                stop_agents(status)
            cp("down", check=False, exe=LAB_EXE)
    if DR_RESULT:
        say(f"replicated recovery point {DR_RESULT['recovery_point']}; drill at DR passed; "
            f"report {DR_RESULT['report']}")
    return 0

