"""`cutpoint-lab bench scale`: coordination overhead against group size
(issue 19, goal 2).  Hangs off the `bench` app of bench.py, which imports
this module; the logic is in cutpoint.bench.scale.  It brings up its own
VM-less lab under the lab lock, starts guest-less QEMUs and agents on it,
and takes it all down afterwards.  Prints a table, writes JSON, never
asserts on time."""

from __future__ import annotations

from typing import Annotated

import typer
from cutpoint.lab.cli.bench import _ints, _log, _with_lab, app
from cutpoint.lab.cli.bench_groupsnap import _errors, _fail, _finish


@app.command()
def scale(
    vms: Annotated[str, typer.Option("--vms", help="group sizes in VMs")] = "10,25,50,100",
    disks: Annotated[int, typer.Option("--disks", min=1, max=8)] = 3,
    hosts: Annotated[int, typer.Option("--hosts", min=1, max=9)] = 4,
    rounds: Annotated[int, typer.Option("--rounds", min=1)] = 10,
    disk_size_mb: Annotated[int, typer.Option("--disk-size-mb", min=1)] = 16,
    pause_path: Annotated[str | None, typer.Option(
        "--pause-path", help="the agents' pause_path (default: the agent's own)")] = None,
    redirect_inline_max: Annotated[int | None, typer.Option(
        "--redirect-inline-max", min=0, max=64,
        help="the agents' redirect_inline_max: VMs per prepare that make their "
             "overlays inside it (default: the agent's own, 8)")] = None,
    json_out: Annotated[str | None, typer.Option("--json", help="write JSON here")] \
        = "out/bench-scale.json",
) -> None:
    """Pause, backend time and coordination overhead of groups of N guest-less
    VMs x D RBD disks on H hosts, with the agent round trip of the same run."""
    from cutpoint.bench import scale as sb

    cfg = sb.ScaleConfig(vms=_ints(vms, "--vms"), disks=disks, hosts=hosts, rounds=rounds,
                         disk_size_mb=disk_size_mb, pause_path=pause_path,
                         redirect_inline_max=redirect_inline_max)
    try:
        doc = _with_lab(cfg.lab_params(), lambda status: sb.run_scale(status, cfg, _log))
    except _errors() as exc:
        _fail(exc)
    _finish(doc, sb.scale_table(doc), json_out)
