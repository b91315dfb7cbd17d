"""Drill checks: what a drill runs over the clones it booted.

A check is a function

    check(site, images) -> {"ok": bool, "summary": str, ...}

over the drill's clones (`images`: `ImageRef`s at the DR `site`, a
`CephSite`, in VM then disk order), run after the guests booted; it reads
them through site.py.  Whatever else it returns goes into
the drill report.  A check that raises is a failed check.

    get(name)   the check called `name`, or UnknownCheck
    known()     every name get() accepts
    register(name, check)   add one in this process

Built in: `writer`, the writer workload's proof (writer_records.py).
Other packages register theirs under the entry-point group
`cutpoint.drill_checks` (plugins.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cutpoint.coordinator.dr import plugins
from cutpoint.coordinator.dr.site import CephSite, ImageRef

Check = Callable[[CephSite, list[ImageRef]], dict[str, Any]]


class UnknownCheck(LookupError):
    """No check of that name (the message lists the known ones), or it cannot be loaded."""


def writer(site: CephSite, images: list[ImageRef]) -> dict[str, Any]:
    """The writer's records on every image are exactly 1..p, each once."""
    from cutpoint.coordinator.dr.writer_records import CephImageSpec, scan_specs

    v = scan_specs([CephImageSpec(site, i) for i in images])
    return {"ok": v.ok, "summary": v.summary(), "verdict": v.as_dict()}


_REGISTRY: dict[str, Check] = {"writer": writer}


def register(name: str, check: Check) -> None:
    if not name or not callable(check):
        raise ValueError(f"a check needs a name and a function, got {name!r}, {check!r}")
    _REGISTRY[name] = check


def known() -> list[str]:
    return sorted(set(_REGISTRY) | set(plugins.names(plugins.DRILL_CHECKS)))


def get(name: str) -> Check:
    builtin = _REGISTRY.get(name)
    if builtin is not None:
        return builtin
    try:
        found = plugins.load(plugins.DRILL_CHECKS, name)
    except plugins.PluginError as exc:
        raise UnknownCheck(str(exc)) from exc
    if found is None:
        raise UnknownCheck(f"no drill check named {name!r} (known: {', '.join(known())})")
    if not callable(found):
        raise UnknownCheck(f"drill check {name!r} is not a function: {found!r}")
    check: Check = found
    _REGISTRY[name] = check
    return check
