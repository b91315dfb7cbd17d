"""A drill's timeline as one row per VM, and that as an SVG an auditor can read.

The drill records events (drill.py): `start`, `clone` (every clone made),
the booter's events, `boot ok` per VM once it is ready, `check` per check,
`cleanup`, `verdict`.  Clone, checks and cleanup are the group's, so each
VM's row shows them at the same times; its boot segment ends when that VM
was ready (or when the drill failed, for a VM that never was).  Segments:

    clone     start -> clone
    wait      clone -> the start of that VM's boot group (a recovery plan's
              later groups wait for the earlier ones to be ready)
    boot      its boot group's start (`boot_group started`; the clone when
              there is none) -> that VM's `boot ok`
    <check>   each check, one after the other, from the last VM ready on
    teardown  last check (or the failure) -> cleanup

The SVG is plain markup (no script), so it renders in any browser and in
the HTML report kept beside the JSON one.
"""

from __future__ import annotations

import html
from typing import Any

# A failed segment is red whatever its step; the others are told apart by step.
FAILED = "#c0392b"
STEP_COLORS = {"clone": "#6f8fbf", "wait": "#d5d9df", "boot": "#2a7d46",
               "teardown": "#8a939e"}
CHECK_COLOR = "#b7791f"
ROW_H, LABEL_W, PLOT_W, AXIS_H = 30, 170, 640, 26


def _t(ev: dict[str, Any] | None) -> float | None:
    return float(ev["t_s"]) if ev else None


def _first(timeline: list[dict[str, Any]], step: str) -> dict[str, Any] | None:
    return next((e for e in timeline if e.get("step") == step), None)


def vm_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per VM of the drill: {"vm", "ready_s", "segments": [{"step", "start_s",
    "end_s", "status"}]}, in the order the drill named the VMs."""
    tl = list(report.get("timeline") or [])
    start = _first(tl, "start")
    vms = list((start or {}).get("vms") or [])
    for g in report.get("guests") or []:
        name = g.get("original") or g.get("vm") or g.get("name")
        if name and name not in vms:
            vms.append(name)
    t_start = _t(start) or 0.0
    failed = _first(tl, "error")
    cleanup = _first(tl, "cleanup")
    t_clone = _t(_first(tl, "clone"))
    t_end_of_run = _t(failed) or _t(cleanup) or (float(tl[-1]["t_s"]) if tl else 0.0)
    ready = {e.get("vm"): float(e["t_s"]) for e in tl
             if e.get("step") == "boot" and e.get("status") == "ok" and e.get("vm")}
    checks = [e for e in tl if e.get("step") == "check" and e.get("status") != "started"]
    started: dict[str, float] = {}  # each VM's boot group began (plan.boot_in_order)
    for e in tl:
        if e.get("step") == "boot_group" and e.get("status") == "started":
            for name in e.get("vms") or []:
                started.setdefault(str(name), float(e["t_s"]))
    t_checks_from = max(ready.values(), default=t_clone or t_start)
    rows = []
    for vm in vms:
        segs: list[dict[str, Any]] = []
        if t_clone is not None:
            segs.append({"step": "clone", "start_s": t_start, "end_s": t_clone, "status": "ok"})
            vm_ready = ready.get(vm)
            t_boot = started.get(vm, t_clone)
            if t_boot > t_clone + 0.05:
                segs.append({"step": "wait", "start_s": t_clone, "end_s": t_boot,
                             "status": "ok"})
            segs.append({"step": "boot", "start_s": t_boot,
                         "end_s": vm_ready if vm_ready is not None else t_end_of_run,
                         "status": "ok" if vm_ready is not None else "failed"})
        prev = t_checks_from
        for c in checks:
            segs.append({"step": str(c.get("check") or "check"), "start_s": prev,
                         "end_s": float(c["t_s"]),
                         "status": "ok" if c.get("status") == "ok" else "failed"})
            prev = float(c["t_s"])
        if cleanup is not None:
            td_from = max(prev, _t(failed) or prev)
            segs.append({"step": "teardown", "start_s": td_from, "end_s": float(cleanup["t_s"]),
                         "status": "ok" if cleanup.get("status") == "ok" else "failed"})
        rows.append({"vm": vm, "ready_s": ready.get(vm), "segments": segs})
    return rows


def svg(rows: list[dict[str, Any]]) -> str:
    """The rows as an SVG Gantt chart: one <g class="vm-row" data-vm=...> per VM."""
    e = html.escape
    total = max((s["end_s"] for r in rows for s in r["segments"]), default=0.0) or 1.0
    height = AXIS_H + ROW_H * max(len(rows), 1) + 8
    width = LABEL_W + PLOT_W + 20

    def x(t: float) -> float:
        return LABEL_W + PLOT_W * t / total

    parts = [(f'<svg xmlns="http://www.w3.org/2000/svg" class="drill-timeline" '
              f'width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
              f'role="img" aria-label="drill timeline, one row per VM" '
              # presentation attributes, not a <style>: a page whose CSP
              # forbids inline styles still draws them
              f'font-family="sans-serif" font-size="12" fill="#1d2430">')]
    for i in range(5):  # the time axis: 0, 1/4, ... of the run
        t = total * i / 4
        parts.append(f'<line x1="{x(t):.1f}" y1="{AXIS_H - 6}" x2="{x(t):.1f}" '
                     f'y2="{height - 4}" stroke="#dde1e7"/>'
                     f'<text fill="#6b7380" x="{x(t):.1f}" y="{AXIS_H - 10}" '
                     f'text-anchor="middle">{t:.1f} s</text>')
    for n, r in enumerate(rows):
        y = AXIS_H + n * ROW_H
        parts.append(f'<g class="vm-row" data-vm="{e(r["vm"])}">'
                     f'<text x="4" y="{y + 19}">{e(r["vm"])}</text>')
        for s in r["segments"]:
            w = max(x(s["end_s"]) - x(s["start_s"]), 2.0)
            color = FAILED if s["status"] == "failed" else STEP_COLORS.get(s["step"], CHECK_COLOR)
            parts.append(
                f'<rect class="seg" data-step="{e(s["step"])}" data-status="{e(s["status"])}" '
                f'x="{x(s["start_s"]):.1f}" y="{y + 5}" width="{w:.1f}" height="{ROW_H - 10}" '
                f'fill="{color}" fill-opacity="0.75" stroke="#fff">'
                f'<title>{e(s["step"])} {s["start_s"]:.2f}-{s["end_s"]:.2f} s: '
                f'{e(s["status"])}</title></rect>')
            if w > 7 * len(s["step"]) + 6:  # the step's name, where it fits
                parts.append(f'<text x="{x(s["start_s"]) + w / 2:.1f}" y="{y + 19}" '
                             f'text-anchor="middle" fill="#fff">{e(s["step"])}</text>')
        parts.append("</g>")
    parts.append("</svg>")
    return "".join(parts)
