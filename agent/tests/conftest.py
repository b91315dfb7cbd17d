"""Fixtures of the agent's integration tests.

The `lab` and `lab_session` fixtures are the lab engineer's, from
dr-tests/tests/conftest.py (loaded by path: that folder is not a package).
`agents` starts one cutpointd per lab host for one test and stops it after.
"""

from __future__ import annotations

import importlib.util
import os
import ssl
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]

_spec = importlib.util.spec_from_file_location(
    "cutpoint_lab_conftest", ROOT / "dr-tests" / "tests" / "conftest.py")
assert _spec and _spec.loader
_labconf = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_labconf)

lab_session = _labconf.lab_session
lab = _labconf.lab
pytest_configure = _labconf.pytest_configure


@pytest.fixture
def certs_dir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="cp-agent-certs-"))
    yield d
    subprocess.run(["rm", "-rf", str(d)], check=False)


# The redirect cut (agent-protocol §5.1) is the agents' default; tests that
# are about it say so anyway.
REDIRECT = "\n[agent]\npause_path = redirect\n"


@contextmanager
def agents_with(lab: dict[str, Any], certs_dir: Path,
                extra: str = "") -> Iterator[list[dict[str, Any]]]:
    """One cutpointd per lab host with `extra` appended to its config, on
    empty journals; stopped at the end."""
    from cutpoint.lab import agents as A

    A.stop_agents(lab)            # a crashed earlier test may have left one
    for d in A.agents_dir(lab).glob("*/journal"):
        d.unlink()
    recs = A.start_agents(lab, certs_dir, extra=extra)
    try:
        yield recs
    finally:
        A.stop_agents(lab)


@pytest.fixture
def agents(lab: dict[str, Any], certs_dir: Path) -> Iterator[list[dict[str, Any]]]:
    # The agents' defaults: the redirect cut where a VM can take it.
    with agents_with(lab, certs_dir) as recs:
        yield recs


def coordinator_context(certs: Path) -> ssl.SSLContext:
    from cutpoint.agentclient import client_context

    return client_context(certs / "ca.pem", certs / "coordinator.pem",
                          certs / "coordinator.key")


os.environ.setdefault("PYTHONASYNCIODEBUG", "0")
