"""Booters and drill checks, found by name: built in, or plugged in by entry point.

A package plugs in through its metadata: here a real distribution
(`*.dist-info` with `entry_points.txt`) written to a directory put on
sys.path, which is what `pip install` of such a package leaves behind.
The test bed's own (`lab`, `kvstore`, `sharedlog`) come from this
project's setup.cfg.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from cutpoint.api.config import Settings
from cutpoint.coordinator.dr import checks
from cutpoint.coordinator.dr.boot import (
    DRILL,
    FAILOVER,
    AgentBooter,
    BootDisk,
    BootRequest,
    BootVM,
    DrillBootUnsupported,
    NoAgent,
    UnknownBooter,
    known_booters,
    load_booter,
)
from cutpoint.coordinator.dr.site import CephSite, ImageRef
from pydantic import ValidationError

SITE = CephSite("dr", pools={"rbd": "rbd"}, ceph_conf="/nonexistent/ceph.conf")

PROBE = '''
class ProbeBooter:
    purposes = frozenset({"failover"})
    def preflight(self, req): return []
    def start(self, req, on_event=None): return []
    def wait_ready(self, req, guests, timeout_s, on_event=None): pass
    def stop(self, req, guests): return []
    def leftovers(self, req): return {}

def probe_check(site, images):
    return {"ok": True, "summary": f"probed {len(images)} image(s)"}
'''
ENTRY_POINTS = """[cutpoint.booters]
probe = cp_probe_plugin:ProbeBooter
broken = cp_probe_missing_module:Nothing

[cutpoint.drill_checks]
probe = cp_probe_plugin:probe_check
"""


@pytest.fixture
def probe_dist(tmp_path: Path) -> Iterator[Path]:
    """An installed distribution `cp-probe` registering a booter and a check."""
    (tmp_path / "cp_probe_plugin.py").write_text(PROBE)
    info = tmp_path / "cp_probe-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: cp-probe\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(ENTRY_POINTS)
    sys.path.insert(0, str(tmp_path))
    try:
        yield tmp_path
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("cp_probe_plugin", None)


def test_the_agent_booter_is_built_in() -> None:
    assert isinstance(load_booter("agent"), AgentBooter)
    assert "agent" in known_booters()


def test_a_booter_is_chosen_by_its_entry_point(probe_dist: Path) -> None:
    assert {"agent", "probe", "broken"} <= set(known_booters())
    booter = load_booter("probe")
    assert type(booter).__name__ == "ProbeBooter"
    assert booter.purposes == frozenset({FAILOVER})
    # The setting accepts it, and only it besides the known ones.
    assert Settings(token_secret="x" * 16, booter="probe").booter == "probe"  # type: ignore[arg-type]


def test_the_test_bed_plugs_in_its_booter_and_checks() -> None:
    """setup.cfg registers the lab's booter and its checkers; the product
    finds them by name without naming them."""
    booter = load_booter("lab")
    assert type(booter).__module__ == "cutpoint.lab.drillboot"
    assert booter.purposes == frozenset({FAILOVER, DRILL})
    assert {"writer", "kvstore", "sharedlog"} <= set(checks.known())
    assert checks.get("kvstore").__module__ == "cutpoint.checkers.drillchecks"


def test_an_unknown_booter_is_a_clear_error() -> None:
    with pytest.raises(UnknownBooter) as ei:
        load_booter("nosuch")
    assert "no booter named 'nosuch'" in str(ei.value)
    assert "agent" in str(ei.value)  # the message lists the known ones
    with pytest.raises(ValidationError) as ve:
        Settings(token_secret="x" * 16, booter="nosuch")  # type: ignore[arg-type]
    assert "no booter named 'nosuch'" in str(ve.value) and "booter" in str(ve.value)


def test_a_booter_that_cannot_be_loaded_says_so(probe_dist: Path) -> None:
    with pytest.raises(UnknownBooter) as ei:
        load_booter("broken")
    msg = str(ei.value)
    assert "cp_probe_missing_module:Nothing" in msg and "cannot be loaded" in msg
    assert "ModuleNotFoundError" in msg


def test_checks_by_name(probe_dist: Path) -> None:
    assert checks.get("writer") is checks.writer
    images = [ImageRef("rbd", "a"), ImageRef("rbd", "b")]
    assert checks.get("probe")(SITE, images) == {"ok": True, "summary": "probed 2 image(s)"}
    assert "probe" in checks.known()
    with pytest.raises(checks.UnknownCheck) as ei:
        checks.get("nosuch")
    assert "no drill check named 'nosuch'" in str(ei.value) and "writer" in str(ei.value)


def _request(purpose: str, **kw: object) -> BootRequest:
    return BootRequest(purpose, SITE, [BootVM("vm1", (BootDisk("disk0", "vm1-disk0"),))],
                       "t", **kw)  # type: ignore[arg-type]


def test_the_agent_booter_boots_a_drill_only_from_signed_transient_definitions() -> None:
    booter = AgentBooter()
    assert DRILL in booter.purposes and booter.needs_definitions
    with pytest.raises(DrillBootUnsupported) as ei:
        booter.start(_request(DRILL))
    assert "vm1: no signed transient definition" in str(ei.value)
    assert "captured definition" in str(ei.value)
    # signed but persistent: a drill's copy would stay defined after vm.stop
    with pytest.raises(DrillBootUnsupported):
        booter.start(_request(DRILL, specs={"vm1": {"vm": "vm1", "xml": "<domain/>",
                                                    "sig": "x"}}))


def test_the_agent_booter_names_the_vms_no_agent_starts() -> None:
    with pytest.raises(NoAgent) as ei:
        AgentBooter().start(_request(FAILOVER, tls=("ca", "cert", "key")))
    assert "vm1" in str(ei.value) and "register" in str(ei.value)
