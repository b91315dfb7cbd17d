"""The `lab` fixture: a real lab (Ceph x2, host namespaces, QEMU guests).

Use it as

    @pytest.mark.lab
    @pytest.mark.lab_config(hosts=2, vms_per_host=2, disks=2, workload="labcheck")
    def test_x(lab):            # lab is the status dict of `cutpoint-lab status --json`
        ...

or with `@pytest.mark.parametrize("lab", [{...}], indirect=True)`.  Keys are
the fields of cutpoint.lab.config.LabConfig, plus `fresh=True` to force a new
lab even if an identical healthy one is up.

The first test that needs a lab takes the machine-wide lab lock
(/run/lock/cutpoint-lab.lock), waiting for it; the session keeps it until
the end and then tears the lab down.  A lab whose parameters match and
whose processes are all alive is reused by the next test, which keeps the
suite short; any other lab is torn down and replaced.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import pytest
from cutpoint.lab import config as C
from cutpoint.lab import down as lab_down
from cutpoint.lab import lock
from cutpoint.lab import up as lab_up
from cutpoint.lab.errors import LabError
from cutpoint.lab.status import health, load_status


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "lab_config(**params): parameters of the lab the `lab` fixture brings up")


class LabSession:
    """Owns the lab lock and the current lab for one pytest session."""

    def __init__(self) -> None:
        self._stack = contextlib.ExitStack()
        self.locked = False
        self.status: dict[str, Any] | None = None
        self.params: dict[str, Any] | None = None
        self.log: list[str] = []

    def _say(self, msg: str) -> None:
        self.log.append(msg)
        print(f"lab: {msg}", flush=True)

    def lock(self) -> None:
        if not self.locked:
            self._stack.enter_context(lock.lab_lock(wait=True, log=self._say))
            self.locked = True

    def get(self, params: dict[str, Any]) -> dict[str, Any]:
        self.lock()
        params = dict(params)
        fresh = params.pop("fresh", False)
        # a test that names the default driver wants the same lab as one that
        # does not: compare them as equal
        params.setdefault("driver", C.default_driver())
        if (not fresh and self.status is not None and self.params == params
                and self._still_ours(self.status)):
            return self.status
        self.status = None
        cfg = C.LabConfig(**params)
        self.status = lab_up.up(cfg, log=self._say)
        self.params = params
        return self.status

    @staticmethod
    def _still_ours(status: dict[str, Any]) -> bool:
        """The lab on disk is the one we brought up, and all of it runs."""
        try:
            on_disk = load_status(status["state_dir"])
        except LabError:
            return False
        return (on_disk.get("started_at") == status.get("started_at")
                and on_disk.get("phase") == "up" and health(status)["ok"])

    def down(self) -> list[str]:
        self.lock()
        self.status = None
        self.params = None
        return lab_down.down(log=self._say)

    def close(self) -> None:
        try:
            if self.locked:
                self.down()
        finally:
            self._stack.close()
            self.locked = False


@pytest.fixture(scope="session")
def lab_session() -> Iterator[LabSession]:
    if os.geteuid() != 0:
        pytest.skip("the lab needs root")
    s = LabSession()
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
def lab(request: pytest.FixtureRequest, lab_session: LabSession) -> Iterator[dict[str, Any]]:
    params: dict[str, Any] = {}
    m = request.node.get_closest_marker("lab_config")
    if m is not None:
        params.update(m.kwargs)
    if hasattr(request, "param"):
        params.update(request.param)
    yield lab_session.get(params)
