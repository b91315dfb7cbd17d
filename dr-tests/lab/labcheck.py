"""The `labcheck` guest behaviour, host side: expected patterns and results.

The tiny image's init (dr-tests/images/tiny/init) writes PATTERN_BYTES of
`cutpoint-labcheck vm=<name> disk=<index>\\n`, repeated, to the start of each
disk, then pings every peer, printing `CP-LABCHECK ...` lines on the console.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from cutpoint.lab.errors import LabError
from cutpoint.lab.vms import console_lines

PATTERN_BYTES = 65536


def expected_pattern(vm: str, disk: int) -> bytes:
    line = f"cutpoint-labcheck vm={vm} disk={disk}\n".encode()
    return (line * (PATTERN_BYTES // len(line) + 1))[:PATTERN_BYTES]


def wait_done(status: dict[str, Any], timeout: float = 240) -> dict[str, list[dict[str, str]]]:
    """Wait until every guest printed `CP-LABCHECK done`; {vm: parsed lines}."""
    deadline = time.monotonic() + timeout
    while True:
        lines = {vm["name"]: console_lines(vm) for vm in status["vms"]}
        missing = [n for n, recs in lines.items() if not any(r["kind"] == "done" for r in recs)]
        if not missing:
            return lines
        if time.monotonic() > deadline:
            tails = {vm["name"]: Path(vm["console"]).read_text(errors="replace")[-300:]
                     for vm in status["vms"] if vm["name"] in missing}
            raise LabError(f"labcheck not done after {timeout:.0f}s on {missing}: {tails}")
        time.sleep(1)
