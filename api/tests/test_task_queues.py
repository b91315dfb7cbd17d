"""Every task has a queue.

`send()` looks the queue up by task name; a task without one can never be
enqueued (the DR tasks once were not: replication silently never ran).
"""

from __future__ import annotations

import re
from pathlib import Path

from cutpoint.api.cli.server import ALL_QUEUES
from cutpoint.api.worker import QUEUES

TASKS = sorted((Path(__file__).resolve().parents[1]).glob("tasks*.py"))


def test_every_task_has_a_queue_that_the_embedded_worker_consumes() -> None:
    names = [n for f in TASKS
             for n in re.findall(r'^@cutpoint_task\("([a-z_]+)"', f.read_text(), re.MULTILINE)]
    assert len(names) >= 9, names
    missing = [n for n in names if n not in QUEUES]
    assert not missing, f"tasks without a queue: {missing}"
    consumed = set(ALL_QUEUES.split(","))
    unconsumed = {n: QUEUES[n] for n in names if QUEUES[n] not in consumed}
    assert not unconsumed, f"queues no embedded worker consumes: {unconsumed}"
