"""The sweep of an interrupted drill (coordinator/dr/drill.py
sweep_interrupted), without a drill: which VMs it stops."""

from __future__ import annotations


def test_a_sweep_stops_started_vms_its_state_does_not_list() -> None:
    """A drill killed between its VMs' start and the state written after it
    (guests: []) leaves running VMs; the sweep of the redelivered job asks
    the booter which of the VMs it was to start are there, and stops those
    (CI rehearsal of 7b6d99e: both domains left running, clones busy)."""
    from types import SimpleNamespace

    from cutpoint.coordinator.dr.boot import BootVM, Guest
    from cutpoint.coordinator.dr.drill import _unrecorded_guests

    class Booter:
        def __init__(self, states: dict[str, str]) -> None:
            self.asked: list[list[str]] = []
            self._states = states

        def states(self, req: object, vms: list[str]) -> dict[str, str]:
            self.asked.append(vms)
            return {vm: self._states.get(vm, "absent") for vm in vms}

    events: list[tuple] = []
    req = SimpleNamespace(vms=[BootVM("drill-x-a", ()), BootVM("drill-x-b", ()),
                               BootVM("drill-x-c", ())])
    booter = Booter({"drill-x-a": "running", "drill-x-b": "running"})
    d = SimpleNamespace(booter=booter, request=req, guests=[Guest("drill-x-a")],
                        event=lambda *a, **k: events.append(a))
    _unrecorded_guests(d)  # type: ignore[arg-type]
    assert [g.vm for g in d.guests] == ["drill-x-a", "drill-x-b"]
    assert booter.asked == [["drill-x-b", "drill-x-c"]]
    # a booter that cannot say what runs: nothing added, nothing asked
    d2 = SimpleNamespace(booter=object(), request=req, guests=[], event=d.event)
    _unrecorded_guests(d2)  # type: ignore[arg-type]
    assert d2.guests == [] and events == []
