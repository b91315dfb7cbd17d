"""The drill report as one self-contained HTML page (no script, no external
asset): verdict, the recovery point and its age, the RTO, the timeline as
an SVG with one row per VM (drill_timeline.py), each check with its output,
the cleanup, and the guests' consoles where the drill kept them.

`render_html(report)` is the page the drill writes beside report.json;
`render_evidence(evidence)` is the one the API serves, which adds what only
the control plane knows (group, the point's age, RTO from the request).
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from cutpoint.coordinator.dr import drill_timeline

STYLE = ("body{font:14px sans-serif;color:#1d2430;margin:1.5rem;max-width:1000px}"
         "table{border-collapse:collapse}td,th{border:1px solid #dde1e7;padding:3px 6px;"
         "text-align:left;vertical-align:top}.passed{color:#2a7d46}.failed{color:#c0392b}"
         "pre{background:#f6f7f9;padding:.5rem;overflow:auto;max-height:24rem}")


def _secs(v: Any) -> str:
    return "-" if v is None else f"{float(v):.1f} s"


def _detail(d: dict[str, Any], skip: tuple[str, ...]) -> str:
    return json.dumps({k: v for k, v in d.items() if k not in skip}, default=str)[:400]


def _page(r: dict[str, Any], facts: list[tuple[str, str]], rows: list[dict[str, Any]],
          checks: list[dict[str, Any]], consoles: dict[str, str]) -> str:
    e = html.escape
    verdict = str(r.get("verdict") or "none")
    head = "".join(f"<tr><th>{e(k)}</th><td>{v}</td></tr>" for k, v in facts)
    check_rows = "".join(
        f"<tr class='check' data-check='{e(str(c['name']))}'><td>{e(str(c['name']))}</td>"
        f"<td class='{'passed' if c['ok'] else 'failed'}'>{'pass' if c['ok'] else 'FAIL'}</td>"
        f"<td>{_secs(c.get('seconds'))}</td><td>{e(str(c.get('summary') or ''))}"
        f"<pre>{e(json.dumps(c.get('output') or {}, indent=1, default=str)[:4000])}</pre></td></tr>"
        for c in checks) or "<tr><td colspan=4>no check ran</td></tr>"
    events = "".join(
        f"<tr><td>{float(ev.get('t_s', 0)):.2f}</td><td>{e(str(ev.get('step')))}</td>"
        f"<td>{e(str(ev.get('status')))}</td>"
        f"<td><code>{e(_detail(ev, ('t_s', 'at', 'step', 'status')))}</code></td></tr>"
        for ev in r.get("timeline") or [])
    cons = "".join(f"<h3>{e(vm)}</h3><pre>{e(text)}</pre>" for vm, text in consoles.items())
    order = "".join(
        f"<tr class='boot-group' data-order='{e(str(b.get('order')))}'>"
        f"<td>{e(str(b.get('order')))}</td><td>{e(str(b.get('group')))}</td>"
        f"<td>{e(', '.join(str(v) for v in b.get('vms') or []))}</td>"
        f"<td>{_secs(b.get('ready_t_s'))}</td></tr>" for b in r.get("boot_order") or [])
    return (f"<!doctype html><html lang=en><meta charset=utf-8>"
            f"<title>drill {e(str(r.get('drill_id') or ''))}: {e(verdict)}</title>"
            f"<style>{STYLE}</style>"
            f"<h1>Drill {e(str(r.get('drill_id') or ''))}: "
            f"<span id=verdict class='{e(verdict)}'>{e(verdict.upper())}</span></h1>"
            f"<table id=facts>{head}</table>"
            + (f"<p id=error class=failed><b>error:</b> {e(str(r['error']))}</p>"
               if r.get("error") else "")
            + f"<h2>Timeline</h2><div id=timeline>{drill_timeline.svg(rows)}</div>"
            + (f"<h2>Boot order</h2><table id=boot-order><tr><th>order</th><th>boot group"
               f"</th><th>VMs</th><th>all ready at</th></tr>{order}</table>" if order else "")
            + f"<h2>Checks</h2><table id=checks><tr><th>check</th><th>result</th>"
            f"<th>time</th><th>output</th></tr>{check_rows}</table>"
            f"<h2>Cleanup</h2><pre id=cleanup>"
            f"{e(json.dumps(r.get('cleanup') or {}, indent=2, default=str))}</pre>"
            f"<h2>Events</h2><table id=events><tr><th>t (s)</th><th>step</th><th>status</th>"
            f"<th>detail</th></tr>{events}</table>"
            + (f"<h2>Consoles</h2>{cons}" if cons else "") + "</html>")


def render_html(r: dict[str, Any]) -> str:
    """The drill's own page, from its report (drill.py), with the consoles' tails."""
    consoles = {}
    for vm, path in (r.get("consoles") or {}).items():
        try:
            consoles[vm] = Path(path).read_text(errors="replace")[-6000:]
        except OSError:
            consoles[vm] = "(no console log)"
    checks = [{**c, "output": {k: v for k, v in c.items()
                               if k not in ("name", "ok", "summary", "seconds")}}
              for c in r.get("checks") or []]
    e = html.escape
    facts = [("recovery point", f"<code>{e(str(r.get('recovery_point')))}</code>"),
             ("booted by", e(str(r.get("booter")))),
             ("all VMs ready after", _secs(r.get("boot_s")))]
    return _page(r, facts, drill_timeline.vm_rows(r), checks, consoles)


def render_evidence(ev: dict[str, Any]) -> str:
    """The API's page, from services.drill_reports.evidence (JSON-ready)."""
    e = html.escape
    facts = [("group", e(str(ev.get("group") or "-"))),
             ("job", f"<code>{e(str(ev['job_id']))}</code> ({e(str(ev.get('state')))})"),
             ("recovery point", (f"<code>{e(str(ev.get('recovery_point') or '-'))}</code>, "
                                 f"cut {e(str(ev.get('point_cut_at') or '-'))}")),
             ("its age when asked for (RPO proved)",
              f"<span id=rpo>{_secs(ev.get('point_age_s'))}</span>"),
             ("requested", e(str(ev.get("requested_at")))),
             ("RTO (request to last VM ready)", f"<span id=rto>{_secs(ev.get('rto_s'))}</span>"),
             ("finished", e(str(ev.get("finished_at") or "-"))),
             ("booted by", e(str(ev.get("booter") or "-")))]
    return _page(ev, facts, list(ev.get("vms") or []), list(ev.get("checks") or []), {})
