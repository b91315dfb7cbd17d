"""A coordinator process for kill -9 tests: it runs one group snapshot and
freezes at the given phase (writing a marker file) until it is killed.

    python coord_child.py SPEC.json DB_URL TXN PHASE MARKER
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

from cutpoint.coordinator import GroupSpec, TxLog, take_group_snapshot


def main() -> None:
    spec_file, url, txn, phase, marker = sys.argv[1:6]
    spec = GroupSpec.from_dict(json.loads(Path(spec_file).read_text()))

    def freeze(_txn: str, p: str) -> None:
        if p == phase:
            Path(marker).write_text(str(time.monotonic()))
            time.sleep(3600)  # blocks the event loop: the process does nothing more

    asyncio.run(take_group_snapshot(spec, TxLog(url), txn=txn, on_event=freeze))


if __name__ == "__main__":
    main()
