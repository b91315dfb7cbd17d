"""Serial console text of a recovered guest, as the drill checkers read it."""

from __future__ import annotations

from collections.abc import Iterable


def recovery_lines(console: str, patterns: Iterable[str]) -> list[str]:
    """The console lines that contain any of `patterns` (a store's own
    recovery log), without the checker's CPCHECK fact lines and carriage
    returns."""
    pats = tuple(patterns)
    out = []
    for line in console.splitlines():
        if any(p in line for p in pats) and "CPCHECK" not in line:
            out.append(line.strip().replace("\r", ""))
    return out
