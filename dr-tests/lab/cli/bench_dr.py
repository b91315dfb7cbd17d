"""`cutpoint-lab bench dr-rpo`: the RPO achieved at DR through the real
control plane (issue 19, goal 4).  Hangs off the `bench` app of bench.py,
which imports this module; the logic is in cutpoint.bench.dr_rpo.  It
brings up its own lab under the lab lock (H hosts x V VMs running the
writer), starts the agents and `cutpoint server --embedded` on it, and
takes it all down afterwards.  Prints a table, writes JSON, never asserts
on time."""

from __future__ import annotations

from typing import Annotated

import typer
from cutpoint.lab.cli.bench import _log, _with_lab, app
from cutpoint.lab.cli.bench_groupsnap import _finish


@app.command("dr-rpo")
def dr_rpo(
    minutes: Annotated[float, typer.Option("--minutes", help="sampling time, minutes")] = 10.0,
    hosts: Annotated[int, typer.Option("--hosts", min=1, max=9)] = 2,
    vms_per_host: Annotated[int, typer.Option("--vms-per-host", min=1, max=8)] = 5,
    rpo: Annotated[int, typer.Option("--rpo", help="the group's RPO, seconds")] = 10,
    sample_s: Annotated[float, typer.Option("--sample-s", help="seconds between samples")]
    = 1.0,
    json_out: Annotated[str | None, typer.Option("--json", help="write JSON here")] \
        = "out/bench-dr-rpo.json",
) -> None:
    """Achieved RPO at DR (p50/p99) of a group of H x V VMs on an RPO schedule,
    with the primary's achieved RPO of the same run and where the lag goes."""
    from cutpoint.bench import dr_rpo as b
    from cutpoint.lab.errors import LabError

    cfg = b.DrRpoConfig(minutes=minutes, hosts=hosts, vms_per_host=vms_per_host, rpo_s=rpo,
                        sample_s=sample_s)
    try:
        cfg.validate()
        doc = _with_lab(cfg.lab_params(), lambda status: b.run_dr_rpo(status, cfg, _log))
    except (b.DrRpoError, LabError) as exc:
        typer.echo(f"cutpoint-lab bench dr-rpo: error: {exc}", err=True)
        raise typer.Exit(1) from None
    _finish(doc, b.table(doc), json_out)
