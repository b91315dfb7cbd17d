"""Records data/thaw_failed_replies.json from the real cutpointd.

Uses the local rig of cutpoint.bench.quiesce (QEMU under TCG without a
guest OS, one cutpointd on 127.0.0.1; vm1 has a guest-agent channel that
nobody answers): prepare fs-freeze with freeze_timeout_ms, commit, stats.
Both the freeze and the thaw after `cont` fail on the 1 s sync deadline,
so the commit reply carries `thaw_error` and `stats` counts `thaw_failed`.

    .venv/bin/python coordinator/tests/record_thaw_failed.py
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

OUT = Path(__file__).parent / "data" / "thaw_failed_replies.json"


async def _record(port: int, certs: Path) -> dict[str, Any]:
    from cutpoint.agentclient import AgentPool
    from cutpoint.agentclient.tls import client_context

    txn = f"rec-thaw-{int(time.time())}"
    ctx = client_context(str(certs / "ca.pem"), str(certs / "coordinator.pem"),
                         str(certs / "coordinator.key"))
    async with AgentPool(ctx) as pool:
        a = pool.get("127.0.0.1", port)
        prep = await a.prepare(txn, ["vm1"], 5000, quiesce="fs-freeze",
                               freeze_timeout_ms=800, timeout=10)
        com = await a.commit(txn, {"vm1/disk0": f"cp.qz.{txn}"}, 5000, timeout=20)
        stats = await a.stats()
        await a.abort(txn)
    return {"txn": txn, "prepare": prep, "commit": com, "stats": stats}


def main() -> None:
    from cutpoint.bench.quiesce import start_local_rig

    rig = start_local_rig(Path(tempfile.mkdtemp(prefix="cprec.", dir="/tmp")))
    try:
        rec = asyncio.run(_record(rig.port, rig.certs))
    finally:
        log = rig.stop()
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    OUT.write_text(json.dumps({"_source": f"cutpointd replies recorded on {when} by "
                               "coordinator/tests/record_thaw_failed.py (local rig: vm1's "
                               "guest-agent channel unanswered)", "thaw_failed": rec},
                              indent=1) + "\n")
    print("\n".join(x for x in log.splitlines() if "thaw" in x), file=sys.stderr)


if __name__ == "__main__":
    main()
