"""The control plane's own log lines (`cutpoint.*` loggers), at `log_level`.

uvicorn configures only its own loggers, so without this the API's
`cutpoint.*` lines below WARNING were dropped whatever `log_level` said.
Celery's worker and beat get the same level through `--loglevel`.
"""

from __future__ import annotations

import logging
import sys

FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


def configure(level: str) -> None:
    """Let `cutpoint.*` records at `level` and above through; where nothing
    handles them yet (the root logger has no handler, as under uvicorn),
    print them on stderr.  Where the root logger has handlers (Celery,
    pytest), the records go there, once."""
    ours = logging.getLogger("cutpoint")
    ours.setLevel(level)
    if logging.getLogger().handlers or ours.handlers:
        return
    h = logging.StreamHandler(sys.stderr)
    h.setFormatter(logging.Formatter(FORMAT))
    ours.addHandler(h)
