"""Implementations that other packages plug in, found by entry point.

Two groups, each a table of name -> object:

    cutpoint.booters       a factory of a `boot.Booter` (called with no arguments)
    cutpoint.drill_checks  a drill check, `checks.Check`

A package registers its own in its metadata, e.g. in setup.cfg

    [options.entry_points]
    cutpoint.booters =
        mine = mypackage.boot:MyBooter

and the product finds it by name.  The product's own implementations are
built in (boot.py, checks.py) and need no entry point.
"""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any

BOOTERS = "cutpoint.booters"
DRILL_CHECKS = "cutpoint.drill_checks"


class PluginError(LookupError):
    """A named plugin is not registered, or cannot be loaded."""


def names(group: str) -> list[str]:
    """The names registered in `group`, sorted (nothing is imported)."""
    return sorted({ep.name for ep in entry_points(group=group)})


def load(group: str, name: str) -> Any | None:
    """The object registered as `name` in `group`; None when no such name."""
    found = [ep for ep in entry_points(group=group) if ep.name == name]
    if not found:
        return None
    if len({ep.value for ep in found}) > 1:
        raise PluginError(f"{group} {name!r} is registered more than once: "
                          + ", ".join(sorted(ep.value for ep in found)))
    try:
        return found[0].load()
    except Exception as exc:  # an ImportError, or any error the module raises at import
        raise PluginError(f"{group} {name!r} ({found[0].value}) cannot be loaded: "
                          f"{type(exc).__name__}: {exc}") from exc
