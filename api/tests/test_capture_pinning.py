"""A host's pinned agent certificate reaches the group snapshot's spec, so
the coordinator's connections check it too (not only the API's own calls)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cutpoint.api.models import Group, Host
from cutpoint.api.schemas.groups import GroupCreate, MemberAdd
from cutpoint.api.services import capture, groups
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker


def test_pinned_fingerprint_reaches_the_spec(session_factory: sessionmaker[Session],
                                             inventory: dict[str, Any], settings: Any,
                                             tmp_path: Path) -> None:
    pin = "0f" * 32
    with session_factory() as s:
        h1 = s.scalars(select(Host).where(Host.name == "primary-h1")).one()
        h1.cert_fingerprint = pin
        g = groups.create(s, GroupCreate(name="pinned"))
        for vm in ("primary-h1-vm1", "primary-h2-vm1"):
            groups.add_member(s, g, MemberAdd(vm=vm))
        s.commit()
        gid = g.id
    tls = settings.model_copy(update={"agent_ca": tmp_path / "ca.pem",
                                      "agent_cert": tmp_path / "c.pem",
                                      "agent_key": tmp_path / "c.key"})
    with session_factory() as s:
        g2 = s.get(Group, gid)
        assert g2 is not None
        spec = capture.build_spec(s, g2, tls).spec
    pins = {a.name: a.cert_sha256 for a in spec.agents}
    assert pins == {"primary-h1": pin, "primary-h2": None}
