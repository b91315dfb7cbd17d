"""`cutpoint-lab bench pause|snapsize|overhead`: the group snapshot
benchmarks.  They hang off the `bench` app of bench.py, which imports this
module.  Each prints a table, writes JSON with --json, and never
asserts on time; the logic is in cutpoint.bench.groupsnap.

pause and overhead bring up their own lab under the lab lock (and take it
down afterwards); snapsize uses a running healthy lab, or a VM-less one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from cutpoint.lab.cli.bench import _ints, _log, _with_lab, app


def _finish(doc: dict[str, Any], table: str, json_out: str | None) -> None:
    typer.echo("")
    typer.echo(table)
    if json_out:
        Path(json_out).parent.mkdir(parents=True, exist_ok=True)
        with open(json_out, "w") as f:
            json.dump(doc, f, indent=2)
            f.write("\n")
        typer.echo(f"\nwrote {json_out}")


def _errors() -> tuple[type[Exception], ...]:
    """What a benchmark run can fail with: shown to the user as is."""
    from cutpoint.bench.groupsnap import BenchError
    from cutpoint.coordinator import (
        CoordinatorError,
        GroupFileError,
        SpecError,
        TxLogError,
    )
    from cutpoint.lab.errors import LabError
    return (BenchError, CoordinatorError, GroupFileError, SpecError, TxLogError,
            LabError, OSError)


def _latencies(text: str) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise typer.BadParameter(f"--backend-latency wants comma-separated ms, got {text!r}") from None
    if not vals or any(v < 0 for v in vals):
        raise typer.BadParameter(f"--backend-latency wants ms >= 0, got {text!r}")
    return vals


def _fail(exc: Exception) -> None:
    typer.echo(f"cutpoint-lab bench: error: {exc}", err=True)
    raise typer.Exit(1) from None


@app.command()
def pause(
    vms: Annotated[str, typer.Option("--vms", help="VM counts, e.g. 2,4,6,8,10")] = "2,4,6,8,10",
    disks: Annotated[int, typer.Option("--disks", min=1, max=8)] = 3,
    hosts: Annotated[int, typer.Option("--hosts", min=1, max=9)] = 3,
    rounds: Annotated[int, typer.Option("--rounds", min=1)] = 20,
    workload: Annotated[str, typer.Option("--workload",
                                          help="guest workload during the rounds")] = "none",
    backend_latency: Annotated[str, typer.Option(
        "--backend-latency",
        help="added snapshot latency of the backend in ms, one set of rows each "
             "(0 = the lab's tuned mon; N = mon paxos_propose_interval N ms)")] = "0",
    pause_path: Annotated[str, typer.Option(
        "--pause-path",
        help="the agents' pause_path, one set of rows each: live, redirect, in_pause "
             "or a list, e.g. live,redirect")] = "redirect",
    json_out: Annotated[str | None, typer.Option("--json", help="write JSON here")] = None,
) -> None:
    """Pause, backend time, overhead and group total per VM count (GCVM Fig. 4.14)."""
    from cutpoint.bench import groupsnap as gs
    paths = [p.strip() for p in pause_path.split(",") if p.strip()]
    if not paths or any(p not in ("live", "redirect", "in_pause") for p in paths):
        _fail(gs.BenchError(f"--pause-path: live, redirect and/or in_pause, "
                            f"got {pause_path!r}"))
    cfg = gs.PauseConfig(vms=_ints(vms, "--vms"), disks=disks, hosts=hosts,
                         rounds=rounds, workload=workload,
                         backend_latency_ms=_latencies(backend_latency),
                         pause_paths=paths)
    try:
        doc = _with_lab(cfg.lab_params(), lambda st: gs.run_pause(st, cfg, _log))
    except _errors() as exc:
        _fail(exc)
    _finish(doc, gs.pause_table(doc), json_out)


@app.command("pause-designs")
def pause_designs(
    rounds: Annotated[int, typer.Option("--rounds", min=1)] = 10,
    disks: Annotated[int, typer.Option("--disks", min=1, max=8)] = 3,
    workload: Annotated[str, typer.Option("--workload",
                                          help="guest workload during the rounds")] = "none",
    backend_latency: Annotated[str, typer.Option(
        "--backend-latency", help="added snapshot latency of the backend in ms")] = "0,500",
    designs: Annotated[str, typer.Option(
        "--designs", help="today, redirect, live, fleecing (comma-separated)")] = "today,redirect,live,fleecing",
    hold_ms: Annotated[int, typer.Option(
        "--hold-ms", min=0, help="live: ms the guest's outbound packets stay held after "
        "its switch (0 = no hold)")] = 10,
    json_out: Annotated[str | None, typer.Option("--json", help="write JSON here")] = None,
) -> None:
    """In-pause time of today's path, redirect on pause, the live switch and CBW fleecing, on one VM."""
    from cutpoint.bench import pause_designs as pd
    chosen = [d.strip() for d in designs.split(",") if d.strip()]
    if not chosen or any(d not in pd.DESIGNS for d in chosen):
        raise typer.BadParameter(f"--designs: choose from {', '.join(pd.DESIGNS)}, got {designs!r}")
    cfg = pd.DesignsConfig(rounds=rounds, disks=disks, workload=workload,
                           backend_latency_ms=_latencies(backend_latency), designs=chosen,
                           hold_ms=hold_ms)
    try:
        doc = _with_lab(cfg.lab_params(), lambda st: pd.run_designs(st, cfg, _log))
    except _errors() as exc:
        _fail(exc)
    _finish(doc, pd.designs_table(doc), json_out)


@app.command()
def snapsize(
    sizes_gib: Annotated[str, typer.Option("--sizes-gib")] = "1,10,100",
    fill_pct: Annotated[str, typer.Option("--fill-pct")] = "0,25,50,100",
    fill_image_gib: Annotated[int, typer.Option("--fill-image-gib", min=1)] = 1,
    rounds: Annotated[int, typer.Option("--rounds", min=1)] = 20,
    json_out: Annotated[str | None, typer.Option("--json", help="write JSON here")] = None,
) -> None:
    """RBD snapshot time against image size and fill level (GCVM Fig. 4.13)."""
    from cutpoint.bench import groupsnap as gs
    fills = [int(x) for x in fill_pct.split(",") if x.strip()]
    if any(not 0 <= f <= 100 for f in fills):
        raise typer.BadParameter("--fill-pct wants percentages 0..100")
    cfg = gs.SnapsizeConfig(sizes_gib=_ints(sizes_gib, "--sizes-gib"), fill_pct=fills,
                            fill_image_gib=fill_image_gib, rounds=rounds)
    try:
        doc = _with_lab(None, lambda st: gs.run_snapsize(st, cfg, _log))
    except _errors() as exc:
        _fail(exc)
    _finish(doc, gs.snapsize_table(doc), json_out)


@app.command()
def overhead(
    interval: Annotated[str, typer.Option("--interval", help="between group snapshots")] = "10s",
    phase: Annotated[str, typer.Option("--phase", help="length of each phase")] = "30s",
    cycles: Annotated[int, typer.Option(
        "--cycles", min=1,
        help="pairs of phases: without, then with snapshots (a last baseline ends the run)")] = 3,
    hosts: Annotated[int, typer.Option("--hosts", min=1, max=9)] = 2,
    disks: Annotated[int, typer.Option("--disks", min=1, max=8)] = 3,
    warmup: Annotated[str, typer.Option(
        "--warmup", help="the writer runs this long untimed before the first phase")] = "30s",
    pause_path: Annotated[str | None, typer.Option(
        "--pause-path",
        help="the agents' pause_path: live, redirect or in_pause (default: the agent's "
             "own default, not set in their config)")] = None,
    json_out: Annotated[str | None, typer.Option("--json", help="write JSON here")] = None,
) -> None:
    """Guest writer throughput without and with periodic group snapshots."""
    from cutpoint.api.cli.snapshot import parse_duration
    from cutpoint.bench import groupsnap as gs
    if pause_path is not None and pause_path not in ("live", "redirect", "in_pause"):
        _fail(gs.BenchError(f"--pause-path: live, redirect or in_pause, got {pause_path!r}"))
    cfg = gs.OverheadConfig(interval_s=parse_duration(interval),
                            phase_s=parse_duration(phase), cycles=cycles,
                            warmup_s=parse_duration(warmup),
                            hosts=hosts, disks=disks, pause_path=pause_path)
    try:
        doc = _with_lab(cfg.lab_params(), lambda st: gs.run_overhead(st, cfg, _log))
    except _errors() as exc:
        _fail(exc)
    _finish(doc, gs.overhead_table(doc), json_out)
