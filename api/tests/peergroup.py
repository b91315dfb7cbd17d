"""A group of VMs on in-process agent peers, registered in a real database.

For tests that drive the control plane's capture (`capture.run`) against
agents: each host is an `AgentPeer` (real mutual TLS, recorded-reply
behaviour, one switch per fault) served from a background event loop, and
is registered with its certificate's fingerprint.  The rows are committed
(the coordinator's log has its own connections), under names of their own,
and removed at the end.
"""

from __future__ import annotations

import asyncio
import hashlib
import ssl
import threading
import uuid
from pathlib import Path
from typing import Any, Self

from cutpoint.agentclient.testing import AgentPeer, make_pki
from cutpoint.api.config import Settings
from cutpoint.api.db import get_sessionmaker
from cutpoint.api.models import Group, Host, Site
from cutpoint.api.schemas.groups import GroupCreate, MemberAdd
from cutpoint.api.schemas.policy import PolicyUpdate
from cutpoint.api.services import groups, inventory, snapshots

SECRET = "peergroup-secret-0123456789"


def fingerprint(pem_path: str) -> str:
    return hashlib.sha256(ssl.PEM_cert_to_DER_cert(Path(pem_path).read_text())).hexdigest()


class PeerGroup:
    def __init__(self, db_url: str, redis_url: str, tmp: Path,
                 hosts: dict[str, dict[str, list[str]]], lease_ms: int = 2000) -> None:
        self.tag = uuid.uuid4().hex[:6]
        names = {h: f"{h}-{self.tag}" for h in hosts}
        pki = make_pki(tmp / "pki", {**{names[h]: ["127.0.0.1"] for h in hosts},
                                     "coordinator": []})
        self.pki = pki
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.peers: dict[str, AgentPeer] = {}
        for h, vms in hosts.items():
            p = AgentPeer(names[h], {f"{v}-{self.tag}": d for v, d in vms.items()},
                          ca=pki["ca"]["cert"], cert=pki[names[h]]["cert"],
                          key=pki[names[h]]["key"])
            self.run(p.start())
            self.peers[h] = p
        self.settings = Settings(
            database_url=db_url, redis_url=redis_url,
            token_secret=SECRET,  # type: ignore[arg-type]
            agent_ca=pki["ca"]["cert"], agent_cert=pki["coordinator"]["cert"],
            agent_key=pki["coordinator"]["key"], agent_timeout_s=3)
        self.sf = get_sessionmaker(db_url)
        with self.sf() as s:
            site = Site(name=f"site-{self.tag}")
            s.add(site)
            s.flush()
            self.site_id = site.id
            g = groups.create(s, GroupCreate(name=f"g-{self.tag}",
                                             policy=PolicyUpdate(lease_ms=lease_ms)))
            for h, p in self.peers.items():
                host = Host(name=names[h], site_id=site.id, address="127.0.0.1",
                            port=p.port, cert_fingerprint=fingerprint(pki[names[h]]["cert"]))
                s.add(host)
                s.flush()
                inventory.apply(s, host, self.run(p._cmd_inventory({})))
                for v in p.vms:
                    groups.add_member(s, g, MemberAdd(vm=v))
            s.commit()
            self.gid, self.group = g.id, g.name

    def run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    def request(self) -> tuple[str, int]:
        """A queued group snapshot job (not sent): (job id, snapshot id)."""
        with self.sf() as s:
            g = s.get(Group, self.gid)
            assert g is not None
            job = snapshots.request(s, g, trigger="manual", actor="test")
            assert job.snapshot_id is not None
            return job.id, job.snapshot_id

    def close(self) -> None:
        from cutpoint.api.services import capture

        # capture keeps one agent pool per worker process; this test's
        # peers go away, so do its connections.
        capture.close_pools()
        for p in self.peers.values():
            self.run(p.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        with self.sf() as s:
            g = s.get(Group, self.gid)
            if g is not None:
                s.delete(g)
            s.flush()
            for h in s.query(Host).filter(Host.site_id == self.site_id):
                s.delete(h)
            s.flush()
            site = s.get(Site, self.site_id)
            if site is not None:
                s.delete(site)
            s.commit()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
