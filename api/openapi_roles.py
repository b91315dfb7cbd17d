"""Each operation's required role in the OpenAPI document, as
`x-required-role`, read from the route's `require(role)` dependency: the
contract then says who may call what, and docs/api.md's route table
(scripts/api-docs.py) is generated from it rather than kept by hand."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute


def _required_role(dep: Dependant) -> str | None:
    role = getattr(dep.call, "required_role", None)
    if role is not None:
        return str(role.value)
    for sub in dep.dependencies:
        found = _required_role(sub)
        if found is not None:
            return found
    return None


def declare_roles(router: APIRouter) -> None:
    """Call before the router is included: included routes copy openapi_extra."""
    for route in router.routes:
        if isinstance(route, APIRoute):
            role = _required_role(route.dependant)
            if role is not None:
                route.openapi_extra = {**(route.openapi_extra or {}), "x-required-role": role}
