"""The replication benchmark's bookkeeping: one pair (a copy by each method
of the same snapshot), one round (the pairs of one change set), the verdicts
and the table.  No Ceph here: the runner (replication_bench.py) fills these.

Methods: cutpoint-sync ("sync"), `rbd export-diff | rbd import-diff`
("pipe") and, with `--baseline ...,rbd-mirror`, rbd-mirror in snapshot mode
("mirror": from the mirror snapshot's creation to its arrival, complete, at
DR).  The write ceiling of the memstore OSD measured in the same run (by
`rbd bench` at the DR site, per write size) turns each rate into a fraction
of what the OSD can take.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

MiB = 1 << 20

# ---- the benchmark ------------------------------------------------------
#
# Every round is measured as `repeats` interleaved pairs, each pair one copy
# by each method of the same snapshots, the first method alternating from
# pair to pair (ABBA...).  A round reports the median and the spread of each
# method; the verdict compares medians.  Before every pair the bench waits
# until neither cluster is doing background work left over from the bench
# itself (snapshot trimming of removed snapshots and images, PGs not
# active+clean): see docs/benchmarks.md "Replication" for the run where the
# trimming of the 256 MiB images overlapped the 1 GiB full copies.


@dataclass
class Pair:
    """One copy by each method of the same snapshot (pair of timings)."""
    changed: int             # rbd diff sum (data + zero extents)
    shipped: int             # cutpoint-sync bytes_shipped
    sync_s: float
    pipe_s: float
    first: str = "sync"      # which method ran first in this pair
    # Where cutpoint-sync's time went (its done event's phase_ms).
    sync_phase_ms: dict[str, float] = field(default_factory=dict)
    # Waited before the pair for the clusters to be idle, and what they
    # were still doing when the wait began (empty: idle at once).
    settle_s: float = 0.0
    busy: list[str] = field(default_factory=list)
    # CPU seconds both OSDs spent while each method ran, and the 1-minute
    # load average when the pair began.
    sync_osd_cpu_s: float = 0.0
    pipe_osd_cpu_s: float = 0.0
    load: float = 0.0
    # rbd-mirror (snapshot mode): seconds from its mirror snapshot to that
    # snapshot complete at DR (None: not measured in this pair), and how
    # long creating the mirror snapshot took (not part of mirror_s).
    mirror_s: float | None = None
    mirror_snap_ms: float | None = None
    mirror_osd_cpu_s: float = 0.0
    # cutpoint-sync --serve (the control plane's path): one session per
    # image size, connected before the rounds; from the request to its
    # done event (None: not measured).
    serve_s: float | None = None
    serve_phase_ms: dict[str, float] = field(default_factory=dict)
    serve_osd_cpu_s: float = 0.0

    @property
    def ratio(self) -> float:
        return self.shipped / self.changed if self.changed else 0.0


def median(xs: Sequence[float]) -> float:
    if not xs:
        raise ValueError("median of no values")
    return float(statistics.median(xs))


def _rate(changed: int, seconds: float) -> float:
    return changed / MiB / seconds if seconds > 0 else 0.0


@dataclass
class Round:
    size_mib: int
    label: str
    pairs: list[Pair] = field(default_factory=list)
    identical: bool | None = None

    @property
    def changed(self) -> int:
        return sum(p.changed for p in self.pairs)

    @property
    def shipped(self) -> int:
        return sum(p.shipped for p in self.pairs)

    @property
    def ratio(self) -> float:
        return self.shipped / self.changed if self.changed else 0.0

    @property
    def sync_s(self) -> float:
        """Median over the pairs."""
        return median([p.sync_s for p in self.pairs])

    @property
    def pipe_s(self) -> float:
        return median([p.pipe_s for p in self.pairs])

    @property
    def mirror_s(self) -> float | None:
        """Median over the pairs that measured rbd-mirror (None: none did)."""
        xs = [p.mirror_s for p in self.pairs if p.mirror_s is not None]
        return median(xs) if xs else None

    @property
    def serve_s(self) -> float | None:
        xs = [p.serve_s for p in self.pairs if p.serve_s is not None]
        return median(xs) if xs else None

    @property
    def io_kib(self) -> int:
        """The write size of the round's change set (full copies: 4 MiB)."""
        return int(self.label.rsplit("/", 1)[1].rstrip("K")) if "/" in self.label else 4096

    def row(self) -> dict[str, Any]:
        ps = self.pairs
        phase_keys = sorted({k for p in ps for k in p.sync_phase_ms})
        return {
            "size_mib": self.size_mib,
            "label": self.label,
            "n": len(ps),
            "changed": self.changed,
            "changed_median": int(median([p.changed for p in ps])),
            "shipped": self.shipped,
            "ratio": round(self.ratio, 4),
            "max_pair_ratio": round(max(p.ratio for p in ps), 4),
            "sync_s": round(self.sync_s, 4),
            "sync_min_s": round(min(p.sync_s for p in ps), 4),
            "sync_max_s": round(max(p.sync_s for p in ps), 4),
            "pipe_s": round(self.pipe_s, 4),
            "pipe_min_s": round(min(p.pipe_s for p in ps), 4),
            "pipe_max_s": round(max(p.pipe_s for p in ps), 4),
            # MiB/s: the median of the pairs' rates (changed / time).
            "sync_mbps": round(median([_rate(p.changed, p.sync_s) for p in ps]), 1),
            "pipe_mbps": round(median([_rate(p.changed, p.pipe_s) for p in ps]), 1),
            "speedup": round(self.pipe_s / self.sync_s, 3) if self.sync_s else 0.0,
            "sync_wins": sum(1 for p in ps if p.sync_s <= p.pipe_s),
            **self._mirror_row(),
            **self._serve_row(),
            "io_kib": self.io_kib,
            "identical": self.identical,
            "sync_phase_ms": {k: round(median([p.sync_phase_ms.get(k, 0.0) for p in ps]), 2)
                              for k in phase_keys},
            "pairs": [asdict(p) for p in ps],
        }

    def _serve_row(self) -> dict[str, Any]:
        ps = [p for p in self.pairs if p.serve_s is not None]
        v = self.serve_s
        if v is None:
            return {"serve_n": 0, "serve_s": None}
        keys = sorted({k for p in ps for k in p.serve_phase_ms})
        m = self.mirror_s
        return {"serve_n": len(ps), "serve_s": round(v, 4),
                "serve_min_s": round(min(p.serve_s or 0.0 for p in ps), 4),
                "serve_max_s": round(max(p.serve_s or 0.0 for p in ps), 4),
                "serve_mbps": round(median([_rate(p.changed, p.serve_s or 0.0)
                                            for p in ps]), 1),
                "speedup_serve": round(median([p.pipe_s for p in ps]) / v, 3) if v else 0.0,
                "speedup_serve_vs_mirror": round(m / v, 3) if m is not None and v else None,
                "serve_phase_ms": {k: round(median([p.serve_phase_ms.get(k, 0.0)
                                                    for p in ps]), 2) for k in keys}}

    def _mirror_row(self) -> dict[str, Any]:
        ms = [p for p in self.pairs if p.mirror_s is not None]
        m = self.mirror_s
        if m is None:
            return {"mirror_n": 0, "mirror_s": None}
        return {"mirror_n": len(ms), "mirror_s": round(m, 4),
                "mirror_min_s": round(min(p.mirror_s or 0.0 for p in ms), 4),
                "mirror_max_s": round(max(p.mirror_s or 0.0 for p in ms), 4),
                "mirror_mbps": round(median([_rate(p.changed, p.mirror_s or 0.0)
                                             for p in ms]), 1),
                "mirror_snap_ms": round(median([p.mirror_snap_ms or 0.0 for p in ms]), 1),
                "speedup_vs_mirror": round(m / self.sync_s, 3) if self.sync_s else 0.0,
                "sync_wins_vs_mirror": sum(1 for p in ms if p.sync_s <= (p.mirror_s or 0.0))}


def _ratio(rounds: Sequence[Round]) -> float | None:
    """Sum of the pipeline's medians over the sum of cutpoint-sync's."""
    s = sum(r.sync_s for r in rounds)
    return round(sum(r.pipe_s for r in rounds) / s, 3) if s else None


def _mirror_ratio(rounds: Sequence[Round]) -> float | None:
    """Sum of rbd-mirror's medians over cutpoint-sync's, on the rounds that
    measured rbd-mirror (None: none did)."""
    have = [r for r in rounds if r.mirror_s is not None]
    s = sum(r.sync_s for r in have)
    return round(sum(r.mirror_s or 0.0 for r in have) / s, 3) if have and s else None


def _serve_ratio(rounds: Sequence[Round], other: str) -> float | None:
    """Sum of `other`'s medians ("pipe" or "mirror") over cutpoint-sync
    --serve's, on the rounds that measured both (None: none did)."""
    have = [r for r in rounds if r.serve_s is not None
            and (other == "pipe" or r.mirror_s is not None)]
    s = sum(r.serve_s or 0.0 for r in have)
    num = sum((r.pipe_s if other == "pipe" else r.mirror_s) or 0.0 for r in have)
    return round(num / s, 3) if have and s else None


def summarize(rounds: Sequence[Round]) -> dict[str, Any]:
    """The verdicts, from the per-round medians (never from one sample)."""
    incr = [r for r in rounds if r.label != "full"]
    full = [r for r in rounds if r.label == "full"]
    pairs = [p for r in rounds for p in r.pairs]
    tot_changed = sum(r.changed for r in incr)
    max_pair = max((p.ratio for r in incr for p in r.pairs), default=0.0)
    ratio = _ratio(rounds)
    inc_ratio, inc_mirror = _ratio(incr), _mirror_ratio(incr)
    serve_pipe, serve_mirror = _serve_ratio(incr, "pipe"), _serve_ratio(incr, "mirror")
    # The targets are judged on the control plane's path (serve) when it
    # was measured, else on the one-shot runs.
    t_pipe = serve_pipe if serve_pipe is not None else inc_ratio
    t_mirror = serve_mirror if serve_pipe is not None else inc_mirror
    return {
        "shipped_over_changed": round(sum(r.shipped for r in incr) / tot_changed, 4)
        if tot_changed else None,
        "max_pair_ratio": round(max_pair, 4),
        # pipeline time / cutpoint-sync time, both sums of per-round medians
        "throughput_ratio_sync_over_pipeline": ratio,
        "full_ratio": _ratio(full),
        "incremental_ratio": inc_ratio,
        # rbd-mirror time / cutpoint-sync time (> 1: cutpoint-sync is faster)
        "incremental_ratio_vs_mirror": inc_mirror,
        "full_ratio_vs_mirror": _mirror_ratio(full),
        # the same for cutpoint-sync --serve (None: not measured)
        "incremental_ratio_serve": serve_pipe,
        "incremental_ratio_serve_vs_mirror": serve_mirror,
        "full_ratio_serve": _serve_ratio(full, "pipe"),
        "full_ratio_serve_vs_mirror": _serve_ratio(full, "mirror"),
        "target_method": "cutpoint-sync --serve" if serve_pipe is not None
        else "cutpoint-sync",
        "rounds_sync_not_slower": sum(1 for r in rounds if r.sync_s <= r.pipe_s),
        "rounds": len(rounds),
        "pairs_sync_not_slower": sum(1 for p in pairs if p.sync_s <= p.pipe_s),
        "pairs": len(pairs),
        "settle_s_total": round(sum(p.settle_s for p in pairs), 1),
        "pairs_busy_before": sum(1 for p in pairs if p.busy),
        "all_identical": bool(rounds) and all(r.identical for r in rounds),
        "target_ratio_met": bool(incr) and max_pair <= 1.05,
        "target_throughput_met": ratio is not None and ratio >= 1.0,
        # issue 19, goal 3: incremental rounds >= 1.5x export-diff|import-diff,
        # and faster than rbd-mirror snapshot mode (None: not measured)
        "target_incremental_1_5_met": t_pipe is not None and t_pipe >= 1.5,
        "target_beats_mirror_met": None if t_mirror is None else t_mirror > 1.0,
    }


def fmt(r: Round, x: Pair) -> str:
    """One pair, as the run logs it."""
    busy = f" (waited {x.settle_s:.1f} s for: {'; '.join(x.busy)})" if x.busy else ""
    mirror = f" rbd-mirror {x.mirror_s:6.2f}s" if x.mirror_s is not None else ""
    if x.serve_s is not None:
        mirror = f" serve {x.serve_s:6.2f}s" + mirror
    return (f"  {r.size_mib:>5} MiB {r.label:>9} #{len(r.pairs)}: changed "
            f"{x.changed / MiB:8.1f} MiB shipped/changed {x.ratio:.3f}  sync "
            f"{x.sync_s:6.2f}s pipeline {x.pipe_s:6.2f}s{mirror} ({x.first} first){busy}")


def _of(mbps: float | None, ceiling: dict[str, Any], io_kib: int) -> str:
    """mbps as a fraction of the OSD's write ceiling at that write size."""
    c = ceiling.get(str(io_kib))
    return f" ({100 * mbps / c:.0f}%)" if mbps is not None and c else ""


def table(doc: dict[str, Any]) -> str:
    ceil = doc.get("ceiling_mbps") or {}
    mirror = any(r.get("mirror_n") for r in doc["rounds"])
    serve = any(r.get("serve_n") for r in doc["rounds"])
    head = ("| image MiB | round | n | changed MiB | shipped/changed | cutpoint-sync s median "
            "(min–max) | MiB/s (of ceiling) | export-diff\\|import-diff s median (min–max) "
            "| MiB/s (of ceiling) | speedup")
    if serve:
        head += (" | cutpoint-sync --serve s median (min–max) | MiB/s (of ceiling) "
                 "| speedup vs export-diff")
    if mirror:
        head += (" | rbd-mirror snapshot s median (min–max) | MiB/s (of ceiling) "
                 "| rbd-mirror / " + ("serve" if serve else "cutpoint-sync") + " time")
    head += " | identical |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in doc["rounds"]:
        io = r.get("io_kib", 4096)
        row = (f"| {r['size_mib']} | {r['label']} | {r['n']} | {r['changed_median'] / MiB:.1f} "
               f"| {r['ratio']:.3f} | {r['sync_s']:.2f} ({r['sync_min_s']:.2f}–"
               f"{r['sync_max_s']:.2f}) | {r['sync_mbps']:.1f}{_of(r['sync_mbps'], ceil, io)} "
               f"| {r['pipe_s']:.2f} ({r['pipe_min_s']:.2f}–{r['pipe_max_s']:.2f}) "
               f"| {r['pipe_mbps']:.1f}{_of(r['pipe_mbps'], ceil, io)} | {r['speedup']:.2f}x")
        if serve:
            if r.get("serve_n"):
                row += (f" | {r['serve_s']:.3f} ({r['serve_min_s']:.3f}–{r['serve_max_s']:.3f})"
                        f" | {r['serve_mbps']:.1f}{_of(r['serve_mbps'], ceil, io)}"
                        f" | {r['speedup_serve']:.2f}x")
            else:
                row += " | - | - | -"
        if mirror:
            if r.get("mirror_n"):
                row += (f" | {r['mirror_s']:.2f} ({r['mirror_min_s']:.2f}–{r['mirror_max_s']:.2f},"
                        f" n={r['mirror_n']}) | {r['mirror_mbps']:.1f}"
                        f"{_of(r['mirror_mbps'], ceil, io)} | "
                        f"{(r.get('speedup_serve_vs_mirror') or r['speedup_vs_mirror']):.2f}x")
            else:
                row += " | - | - | -"
        lines.append(row + f" | {r['identical']} |")
    s = doc["summary"]
    lines.append("")
    if ceil:
        lines.append("memstore OSD write ceiling at DR (rbd bench, 16 threads), MiB/s: "
                     + ", ".join(f"{k} KiB writes {v:.1f}" for k, v in sorted(
                         ceil.items(), key=lambda kv: int(kv[0]))))
    lines.append(f"shipped/changed over all incremental pairs: {s['shipped_over_changed']} "
                 f"(max per pair {s['max_pair_ratio']}; target <= 1.05: "
                 f"{'met' if s['target_ratio_met'] else 'NOT met'})")
    lines.append(f"throughput cutpoint-sync / pipeline (sum of per-round median times): "
                 f"{s['throughput_ratio_sync_over_pipeline']} (full copies "
                 f"{s['full_ratio']}, incremental {s['incremental_ratio']})")
    if s.get("incremental_ratio_serve") is not None:
        lines.append(f"cutpoint-sync --serve (the control plane's path): export-diff time / serve "
                     f"time: incremental {s['incremental_ratio_serve']}, full "
                     f"{s['full_ratio_serve']}; rbd-mirror time / serve time: incremental "
                     f"{s['incremental_ratio_serve_vs_mirror']}, full "
                     f"{s['full_ratio_serve_vs_mirror']}")
    lines.append(f"targets judged on {s['target_method']}: incremental >= 1.5x export-diff: "
                 f"{'met' if s['target_incremental_1_5_met'] else 'NOT met'}; faster than "
                 f"rbd-mirror: " + {None: "not measured", True: "met", False: "NOT met"}[
                     s['target_beats_mirror_met']])
    if s.get("incremental_ratio_vs_mirror") is not None:
        lines.append(f"rbd-mirror time / one-shot cutpoint-sync time: incremental "
                     f"{s['incremental_ratio_vs_mirror']}, full {s['full_ratio_vs_mirror']}")
    lines.append(f"rounds where cutpoint-sync's median is not slower than the pipeline: "
                 f"{s['rounds_sync_not_slower']}/{s['rounds']}; pairs: "
                 f"{s['pairs_sync_not_slower']}/{s['pairs']}")
    lines.append(f"waited for idle clusters: {s['settle_s_total']} s in all, "
                 f"{s['pairs_busy_before']} pairs found leftover work")
    lines.append(f"every DR snapshot identical to the primary by full hash: {s['all_identical']}")
    return "\n".join(lines)
