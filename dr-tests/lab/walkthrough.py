"""`cutpoint-lab dr-walkthrough`: docs/dr.md's operator walkthrough, run for real.

    cutpoint-lab dr-walkthrough [--out FILE.md] [--json FILE.json]

Holds the lab lock for the whole run: lab up (2 primary hosts x 1 guest x
2 RBD disks, the writer ring, 1 DR host), one agent per host (the primary
agents can start their VMs again, as a failback needs), `cutpoint server
--embedded` with the lab's booter (demo.start_server).  Then every step an
operator takes with real VMs, each as the `cutpoint` command (a
subprocess, over the API) and the output it gave:

    register the sites and the hosts, protect a group (a group snapshot
    replicated to DR), drill, fail over, re-protect, fail back, restore as
    clones, restore in place (refused while the VMs run, then done with
    them stopped)

The steps print as markdown (what docs/dr.md's "Walkthrough" shows);
`--json` writes them with each exit status and the one it should have, for
the lab test (dr-tests/tests/test_dr_walkthrough.py).  Exit status 1 when
any step's differs.  The lab is torn down at the end.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import typer
from cutpoint.lab.demo import EXE, LAB_EXE, start_server

GROUP = "app"
# A 409 or other problem answer: the CLI prints it and exits 1 (apiclient.run).
REFUSED = 1


@dataclass
class Step:
    title: str
    argv: list[str]  # after `cutpoint`
    output: str
    rc: int
    expect: int = 0
    note: str = ""

    def markdown(self) -> str:
        note = f"{self.note}\n\n" if self.note else ""
        status = "" if self.rc == 0 else f"\n(exit status {self.rc})"
        return (f"**{self.title}**\n\n{note}```\n$ cutpoint {' '.join(self.argv)}\n"
                f"{self.output.rstrip()}{status}\n```\n")


class Walk:
    """Runs `cutpoint` commands against the server, recording each."""

    def __init__(self, env: dict[str, str], echo: bool, steps: list[Step]) -> None:
        # A fixed width: rich sizes its tables to the terminal, and the
        # output goes into a document.
        self.env = {**env, "COLUMNS": "100", "NO_COLOR": "1", "TERM": "dumb"}
        self.echo = echo
        self.steps = steps

    def run(self, title: str, *args: str, expect: int = 0, note: str = "") -> Step:
        r = subprocess.run([EXE, *args], env=self.env, capture_output=True, text=True,
                           check=False, timeout=900)
        step = Step(title, list(args), r.stdout + r.stderr, r.returncode, expect, note)
        self.steps.append(step)
        if self.echo:
            print(step.markdown(), flush=True)
        return step

    def quiet(self, *args: str) -> Any:
        """A `cutpoint ... --json` the walkthrough reads (not a step of it)."""
        r = subprocess.run([EXE, *args, "--json"], env=self.env, capture_output=True,
                           text=True, check=True, timeout=300)
        return json.loads(r.stdout)


def _interrupted(signum: int, _frame: object) -> None:
    raise SystemExit(f"dr-walkthrough: interrupted by signal {signum}; cleaning up")


OutOpt = typer.Option(None, "--out", help="also write the markdown here")
JsonOutOpt = typer.Option(None, "--json", help="write the steps as JSON here")


def walkthrough(out: Path | None = OutOpt, json_out: Path | None = JsonOutOpt) -> None:
    """docs/dr.md's walkthrough on the lab: every DR step as a real `cutpoint` command."""
    raise typer.Exit(run(out, json_out))


def run(out: Path | None, json_out: Path | None) -> int:
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _interrupted)
    from cutpoint.lab import lock

    steps: list[Step] = []
    broke = ""
    with lock.lab_lock(wait=True, log=print):
        started = datetime.now(UTC)  # once the lab is ours: the run's own time
        try:
            # raw QEMU: the failback step starts the primary VMs again
            # through their raw-QEMU launchers (start_agents primary_start)
            subprocess.run([LAB_EXE, "up", "--driver", "qemu", "--hosts", "2",
                            "--vms-per-host", "1", "--disks", "2", "--workload", "writer"],
                           check=True)
            _steps(steps)
        except (subprocess.SubprocessError, OSError, KeyError, ValueError) as exc:
            broke = f"dr-walkthrough: stopped after {len(steps)} steps: {exc!r}"
        finally:
            subprocess.run([LAB_EXE, "down"], check=False)
    bad = [s for s in steps if s.rc != s.expect]
    head = (f"Run {started:%Y-%m-%d %H:%M} UTC by `cutpoint-lab dr-walkthrough` "
            f"({len(steps)} steps, {len(bad)} with an unexpected exit status).\n\n")
    doc = head + "\n".join(s.markdown() for s in steps)
    if out:
        out.write_text(doc)
    if json_out:
        json_out.write_text(json.dumps({"started": started.isoformat(),
                                        "steps": [asdict(s) for s in steps]}, indent=1))
    for s in bad:
        print(f"dr-walkthrough: `cutpoint {' '.join(s.argv)}` exited {s.rc}, "
              f"expected {s.expect}")
    if broke:
        print(broke)
    return 1 if bad or broke or not steps else 0


def _steps(steps: list[Step]) -> None:
    from cutpoint.lab.agents import start_agents, stop_agents
    from cutpoint.lab.drillboot import stop_guests, stop_standbys
    from cutpoint.lab.sites import cli_args
    from cutpoint.lab.status import load_status

    status = load_status()
    certs = Path(status["state_dir"]) / "certs"
    start_agents(status, certs, primary_start=True)
    state = Path(tempfile.mkdtemp(prefix="cutpoint-walkthrough-"))
    server, env = start_server(state, certs, show=False)
    w = Walk(env, echo=True, steps=steps)
    guests: list[dict[str, Any]] = []
    try:
        _protect(w, status, certs, cli_args)
        _drill(w)
        fo = w.run("Fail over to DR (planned: the primaries are stopped first)",
                   "dr", "failover", GROUP, "--mode", "planned", "--workload", "writer",
                   "--yes")
        if fo.rc == 0:
            guests = _guests(w)
            w.run("Re-protect: replicate from DR back to the primary",
                  "dr", "re-protect", GROUP)
            w.run("Fail back to the primary (a planned failover back, then re-protect)",
                  "dr", "failback", GROUP, "--workload", "writer", "--yes")
            stop_guests(guests)  # the DR guests the failover booted (fenced, stopped)
            guests = _guests(w)
            w.run("The group after the round trip", "dr", "status", GROUP, "--limit", "3")
            _restore(w, guests, stop_guests)
    finally:
        server_stop(server)
        stop_guests(guests)
        stop_standbys(status)
        stop_agents(status)


def _protect(w: Walk, status: dict[str, Any], certs: Path, cli_args: Any) -> None:
    w.run("Register the primary site with its Ceph access (checked first)",
          "site", "add", "primary", *cli_args(status, "primary"),
          note="The lab's paths and names: use your cluster's ceph.conf (or `--mon-host`), "
               "your cephx client and its keyring, and your pool map.")
    w.run("Register the DR site", "site", "add", "dr", *cli_args(status, "dr"))
    w.run("Check a site again at any time", "site", "check", "dr")
    for h in status["hosts"]:
        w.run(f"Register host {h['name']} ({h['site']}), pinned to its agent's certificate",
              "host", "add", h["name"], "--site", h["site"], "--address", h["address"],
              "--cert", str(certs / f"{h['name']}.pem"))
    w.run("The hosts and their agents", "host", "list")
    w.run("A group replicated to DR", "group", "create", GROUP, "--lease-ms", "3000",
          "--pause-budget-ms", "2000", "--keep-last", "100", "--replication-target", "dr")
    for vm in status["vms"]:
        if vm["site"] == "primary":
            w.run(f"Add VM {vm['name']} (with its host: the DR host lists a standby of the "
                  "same name)", "group", "add-vm", GROUP, vm["name"], "--host", vm["host"])
    w.run("Take a group snapshot (its commit queues the copy to DR)",
          "group", "snapshot", GROUP)
    for _ in range(300):
        if w.quiet("dr", "status", GROUP)["newest_recovery_point"]:
            break
        time.sleep(1)
    w.run("Replication state: the snapshot is a verified recovery point at DR",
          "dr", "status", GROUP, "--limit", "3")


def _drill(w: Walk) -> None:
    w.run("Drill the newest recovery point at DR (clones on an isolated network)",
          "drill", "run", GROUP)
    w.run("The group's drills", "drill", "list", GROUP)
    drills = w.quiet("drill", "list", GROUP)
    items = drills.get("items", drills) if isinstance(drills, dict) else drills
    if items:
        w.run("One drill's report", "drill", "show", str(items[0]["id"]))


def _restore(w: Walk, guests: list[dict[str, Any]], stop_guests: Any) -> None:
    w.run("Restore the newest group snapshot as clones (the originals untouched)",
          "restore", "clone", GROUP, "--snapshot", "latest")
    w.run("Restore in place while the VMs run: refused, naming them",
          "restore", "in-place", GROUP, "--snapshot", "latest", "--yes", expect=REFUSED)
    # The operator shuts the VMs down with their own tools; the lab stops
    # its QEMUs.  The agents then list them shutoff.
    stop_guests(guests)
    time.sleep(2)
    w.run("Restore in place with the VMs stopped",
          "restore", "in-place", GROUP, "--snapshot", "latest", "--yes",
          note="The VMs were shut down outside cutpoint first (in the lab: their QEMUs "
               "stopped).")


def _guests(w: Walk) -> list[dict[str, Any]]:
    """The guests the newest failover job booted (from its result), to stop them."""
    jobs = w.quiet("job", "list", "--kind", "failover")
    items = jobs.get("items", jobs) if isinstance(jobs, dict) else jobs
    newest = items[0] if items else {}
    return list((newest.get("result") or {}).get("guests") or [])


def server_stop(server: subprocess.Popen[bytes]) -> None:
    if server.poll() is None:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(60)
