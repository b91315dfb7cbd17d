"""`cutpoint-lab bench ...`: every benchmark; each prints a table and writes JSON.

Each benchmark is one command of this sub-app (the group snapshot ones in
bench_groupsnap.py); they run on the lab (control-plane: on an in-process
agent peer) and never assert on time (see docs/benchmarks.md).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Annotated, Any

import typer
from cutpoint.bench.quiesce import cli as quiesce_cli

app = typer.Typer(help="Every benchmark: each prints a table and writes JSON.",
                  no_args_is_help=True)


def _log(msg: str) -> None:
    typer.echo(msg)
    sys.stdout.flush()


def _with_lab(params: dict[str, Any] | None,
              body: Callable[[dict[str, Any]], dict[str, Any]]) -> dict[str, Any]:
    """Run body(status) on a lab: a fresh one with params, or (params None)
    the running healthy lab or else a VM-less one."""
    from cutpoint.lab import config as C
    from cutpoint.lab import down as lab_down
    from cutpoint.lab import lock
    from cutpoint.lab import up as lab_up
    from cutpoint.lab.errors import LabNotUp
    from cutpoint.lab.status import health, load_status
    with ExitStack() as stack:
        stack.enter_context(lock.lab_lock(wait=True, log=_log))
        if params is None:
            try:
                status = load_status()
                if not health(status)["ok"]:
                    raise LabNotUp("lab not healthy")
                _log("using the running lab")
            except LabNotUp:
                _log("bringing up a VM-less lab (two Ceph sites)")
                status = lab_up.up(C.LabConfig(hosts=1, vms_per_host=0), log=_log)
                stack.callback(lab_down.down, log=_log)
        else:
            _log(f"bringing up a lab: {params}")
            stack.callback(lab_down.down, log=_log)
            status = lab_up.up(C.LabConfig(**params), log=_log)
        return body(status)


def _ints(text: str, what: str) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise typer.BadParameter(f"{what} wants comma-separated integers, got {text!r}") from None
    if not vals or any(v <= 0 for v in vals):
        raise typer.BadParameter(f"{what} wants positive integers, got {text!r}")
    return vals


def _rounds(text: str) -> list[tuple[int, int]]:
    out = []
    for part in text.split(","):
        mib, _, kib = part.strip().partition("@")
        try:
            r = (int(mib), int(kib or "1024"))
        except ValueError:
            raise typer.BadParameter(f"--changes wants MiB@KiB items, got {part!r}") from None
        if r[0] <= 0 or not 4 <= r[1] <= 4096:
            raise typer.BadParameter(f"--changes: bad round {part!r} (MiB > 0, 4 <= KiB <= 4096)")
        out.append(r)
    return out


@app.command()
def replication(
    json_out: str = typer.Option("out/bench-replication.json", "--json",
                                 help="write the results to this JSON file"),
    sizes_mib: str = typer.Option("256,512", "--sizes-mib", help="image sizes, MiB (the DR "
                                  "OSD holds a copy of each per method: 3 GiB in all)"),
    changes: str = typer.Option("4@64,4@1024,16@1024,64@1024", "--changes",
                                help="incremental rounds: MiB changed @ write size KiB"),
    jobs: int = typer.Option(16, "--jobs", help="cutpoint-sync workers"),
    repeats: int = typer.Option(3, "--repeats", min=1, max=50,
                                help="interleaved turns per round"),
    baseline: str = typer.Option("export-diff", "--baseline",
                                 help="export-diff, or export-diff,rbd-mirror (rbd-mirror "
                                      "in snapshot mode, one daemon at DR)"),
    ceiling: bool = typer.Option(True, "--ceiling/--no-ceiling",
                                 help="measure the DR OSD's write ceiling (rbd bench)"),
    serve: bool = typer.Option(True, "--serve/--no-serve",
                               help="also time cutpoint-sync --serve (the control plane's "
                                    "path), one session per image size"),
) -> None:
    """cutpoint-sync against `rbd export-diff | rbd import-diff` (and rbd-mirror
    in snapshot mode) on the same change sets, with the OSD's write ceiling.

    Uses the running lab if it is healthy; otherwise brings up a VM-less lab
    (two Ceph sites) under the lab lock and tears it down afterwards."""
    from cutpoint.bench import replication as rt
    from cutpoint.bench import replication_bench as rb
    from cutpoint.bench.replication_report import table
    from cutpoint.lab.errors import LabError

    if not 1 <= jobs <= 64:
        raise typer.BadParameter("--jobs wants 1..64")
    cfg = rb.BenchConfig(sizes_mib=_ints(sizes_mib, "--sizes-mib"),
                         changes=_rounds(changes), jobs=jobs, repeats=repeats,
                         baselines=[b.strip() for b in baseline.split(",") if b.strip()],
                         ceiling=ceiling, serve=serve)
    try:
        cfg.validate()
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    from cutpoint.coordinator.dr.replicate import ReplicationError

    try:
        rt.sync_binary()
        if cfg.mirror:
            from cutpoint.bench.replication_mirror import mirror_binary
            mirror_binary()
    except (ReplicationError, rt.ReplicationError) as exc:
        typer.echo(f"cutpoint-lab bench: error: {exc}", err=True)
        raise typer.Exit(2) from None
    try:
        doc = _with_lab(None, lambda status: rb.run_benchmark(status, cfg, log=_log))
    except (LabError, rt.ReplicationError) as exc:
        typer.echo(f"cutpoint-lab bench: error: {exc}", err=True)
        raise typer.Exit(1) from None
    typer.echo("")
    typer.echo(table(doc))
    if json_out:
        Path(json_out).parent.mkdir(parents=True, exist_ok=True)
        with open(json_out, "w") as f:
            json.dump(doc, f, indent=2)
            f.write("\n")
        typer.echo(f"\nwrote {json_out}")

@app.command()
def agent(
    rounds: int = typer.Option(50, "--rounds", min=1, max=10000,
                               help="group snapshots per snapshot method"),
    json_out: str = typer.Option("out/bench-agent.json", "--json",
                                 help="write the results to this JSON file"),
    keep_lab: bool = typer.Option(False, "--keep-lab", help="leave the lab up afterwards"),
) -> None:
    """p50/p99/max of cutpointd's stop, snapshot and cont per method (librbd, QMP)."""
    from pathlib import Path

    from cutpoint.bench import agent as bench_agent
    from cutpoint.lab.errors import LabError

    Path(json_out).parent.mkdir(parents=True, exist_ok=True)
    try:
        bench_agent.run(rounds=rounds, json_out=json_out, keep_lab=keep_lab, log=_log)
    except LabError as exc:
        typer.echo(f"cutpoint-lab bench agent: error: {exc}", err=True)
        raise typer.Exit(2) from exc


@app.command("control-plane")
def control_plane(
    out: Annotated[Path, typer.Option("--out", help="write the results to this JSON file")]
    = Path("out/bench-control-plane.json"),
    steps: Annotated[str, typer.Option("--steps", help="group counts, comma-separated")]
    = "25,100,400",
    rpo: Annotated[int, typer.Option("--rpo", help="RPO of every group, seconds")] = 60,
    duration: Annotated[float | None, typer.Option(
        "--duration", help="seconds per step (default: 2 RPOs + 10 s)")] = None,
    pool: Annotated[str, typer.Option("--pool", help="the worker's pool: threads or "
                                      "prefork")] = "threads",
    concurrency: Annotated[int, typer.Option("--concurrency", "-c", min=1, max=512,
                                             help="the worker's threads or processes")] = 32,
    keep_going: Annotated[bool, typer.Option(
        "--keep-going", help="run every step, even after one with a miss")] = False,
    database: Annotated[str, typer.Option(
        "--db", help="the capacity steps' database: sqlite or postgresql")] = "sqlite",
) -> None:
    """API p50/p99 and scheduler capacity at an RPO (no lab: an in-process agent peer)."""
    from cutpoint.bench.controlplane import control_plane as run

    if pool not in ("threads", "prefork"):
        raise typer.BadParameter(f"--pool wants threads or prefork, got {pool!r}")
    if database not in ("sqlite", "postgresql"):
        raise typer.BadParameter(f"--db wants sqlite or postgresql, got {database!r}")
    run(out=out, steps=steps, rpo=rpo, duration=duration, pool=pool,
        concurrency=concurrency, keep_going=keep_going, database=database)


app.command("quiesce")(quiesce_cli)

from cutpoint.lab.cli import (
    bench_dr,  # noqa: F401  (dr-rpo)
    bench_groupsnap,  # noqa: F401  (pause, snapsize, overhead)
    bench_scale,  # noqa: F401  (scale)
)
