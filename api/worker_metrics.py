"""The worker's own metrics on `worker_metrics_port`: task runs by outcome
and task run times (`cutpoint_task_runs_total`, `cutpoint_task_seconds`,
defined in tasks.py), summed over the worker's prefork children.

Each child counts in its own process, so the counts are shared through
prometheus_client's multiprocess mode: every process writes its values to
files in `PROMETHEUS_MULTIPROC_DIR`, and the main process serves their
sum.  prometheus_client reads that variable when it is first imported, so
it is set before the worker starts (`cutpoint server worker` and embedded
mode do it: `multiproc_dir()`), never by this module.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from celery.signals import worker_init, worker_process_shutdown

ENV = "PROMETHEUS_MULTIPROC_DIR"
log = logging.getLogger("cutpoint.worker_metrics")


def multiproc_dir(port: int | None) -> dict[str, str]:
    """The environment a worker process starts with when it serves metrics:
    a fresh, empty directory of its own (stale files would add old counts)."""
    if port is None:
        return {}
    d = Path(tempfile.mkdtemp(prefix="cutpoint-worker-metrics-"))
    shutil.rmtree(d)
    d.mkdir(mode=0o700)
    return {ENV: str(d)}


@worker_init.connect
def _serve(sender: Any = None, **_: Any) -> None:
    from cutpoint.api.config import get_settings

    port = get_settings().worker_metrics_port
    if port is None:
        return
    if not os.environ.get(ENV):
        log.error("event=worker_metrics_off why=no_%s port=%s: start the worker with "
                  "`cutpoint server worker`", ENV, port)
        return
    from prometheus_client import CollectorRegistry, multiprocess, start_http_server

    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    start_http_server(port, addr="127.0.0.1", registry=registry)
    log.warning("event=worker_metrics_serving addr=127.0.0.1:%s dir=%s", port, os.environ[ENV])


@worker_process_shutdown.connect
def _child_gone(pid: int | None = None, **_: Any) -> None:
    if os.environ.get(ENV):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid or os.getpid())
