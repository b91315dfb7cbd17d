"""What the broker holds: the tasks queued for a job, read from Redis itself."""

from __future__ import annotations

import json
from typing import Any

import redis
from cutpoint.api.worker import QUEUES


def queued_tasks(settings: Any, job_id: str) -> list[str]:
    """Names of the tasks waiting in the broker's queues with `job_id` as argument."""
    r = redis.Redis.from_url(settings.redis_url)
    out = []
    try:
        for q in sorted(set(QUEUES.values())):
            for raw in r.lrange(q, 0, -1):
                headers = json.loads(raw).get("headers", {})
                if job_id in str(headers.get("argsrepr", "")):
                    out.append(str(headers.get("task")))
    finally:
        r.close()
    return out
