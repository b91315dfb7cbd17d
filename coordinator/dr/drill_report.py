"""The drill report as one HTML page: verdict, checks, timeline, cleanup, consoles."""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any


def render_html(r: dict[str, Any]) -> str:
    e = html.escape
    color = "#2a7" if r["verdict"] == "passed" else "#c33"
    rows = "".join(
        f"<tr><td>{ev['t_s']:.1f}</td><td>{e(ev['step'])}</td><td>{e(ev['status'])}</td>"
        f"<td><code>{e(json.dumps({k: v for k, v in ev.items() if k not in ('t_s', 'at', 'step', 'status')}, default=str)[:400])}</code></td></tr>"
        for ev in r["timeline"])
    checks = "".join(
        f"<li><b>{e(c['name'])}</b>: {'pass' if c['ok'] else 'FAIL'} — {e(c['summary'])}</li>"
        for c in r["checks"]) or "<li>no check ran</li>"
    consoles = ""
    for vm, path in r["consoles"].items():
        try:
            text = Path(path).read_text(errors="replace")[-6000:]
        except OSError:
            text = "(no console log)"
        consoles += f"<h3>{e(vm)}</h3><pre>{e(text)}</pre>"
    return (f"<!doctype html><meta charset=utf-8><title>drill {e(r['drill_id'])}</title>"
            f"<h1>Drill {e(r['drill_id'])}: <span style='color:{color}'>"
            f"{e(r['verdict'].upper())}</span></h1>"
            f"<p>recovery point <code>{e(r['recovery_point'])}</code>, booted by "
            f"{e(str(r.get('booter')))}</p>"
            + (f"<p><b>error:</b> {e(r['error'])}</p>" if r["error"] else "")
            + f"<h2>Checks</h2><ul>{checks}</ul><h2>Timeline</h2>"
            f"<table border=1 cellpadding=3><tr><th>t (s)</th><th>step</th><th>status</th>"
            f"<th>detail</th></tr>{rows}</table>"
            f"<h2>Cleanup</h2><pre>{e(json.dumps(r['cleanup'], indent=2))}</pre>"
            f"<h2>Consoles</h2>{consoles}")
