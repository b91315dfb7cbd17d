"""Group snapshots of several groups in flight at once in one worker
process, their agent calls pipelined on one connection per host (issue 19,
goal 7; docs/operations.md "Performance notes").

Two groups whose VMs are on the same host (an in-process agent-protocol
peer over mutual TLS that holds every COMMIT for a second) are captured
from two threads of one process, as a threads-pool worker runs them: the
second group's PREPARE and COMMIT reach the agent while the first group's
COMMIT is still unanswered, over the one connection the process keeps to
the host.  Before, each process ran one protocol at a time on a loop
private to the calling thread's run; from two threads the second failed
("This event loop is already running").
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from cutpoint.api import services_local
from cutpoint.api.models import Group
from cutpoint.api.schemas.groups import GroupCreate, MemberAdd
from cutpoint.api.schemas.policy import PolicyUpdate
from cutpoint.api.services import capture, groups, snapshots
from peergroup import PeerGroup  # api/tests/peergroup.py


def test_two_groups_on_one_host_are_captured_at_once_over_one_connection(
        db_url: str, local_services: services_local.Endpoints, tmp_path: Path) -> None:
    with PeerGroup(db_url, local_services.redis_url, tmp_path,
                   {"h1": {"vm1": ["disk0"], "vm2": ["disk0", "disk1"]}}) as pg:
        with pg.sf() as s:
            g1 = s.get(Group, pg.gid)
            assert g1 is not None
            m2 = next(m for m in g1.members if m.vm is not None
                      and m.vm.name.startswith("vm2-"))
            groups.remove_member(s, g1, m2.id)
            g2 = groups.create(s, GroupCreate(name=f"g2-{pg.tag}",
                                              policy=PolicyUpdate(lease_ms=3000)))
            groups.add_member(s, g2, MemberAdd(vm=f"vm2-{pg.tag}"))
            s.commit()
            gid2 = g2.id
        try:
            _, sid1 = pg.request()
            with pg.sf() as s:
                g = s.get(Group, gid2)
                assert g is not None
                sid2 = snapshots.request(s, g, trigger="manual", actor="test").snapshot_id
            assert sid2 is not None
            peer = pg.peers["h1"]
            peer.delay["commit"] = 1.0
            out: dict[int, Any] = {}

            def capture_one(sid: int) -> None:
                try:
                    out[sid] = capture.run(pg.sf, pg.settings, sid)
                except Exception as exc:  # noqa: BLE001  reported below
                    out[sid] = exc

            threads = [threading.Thread(target=capture_one, args=(sid,)) for sid in (sid1, sid2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(30)
            print(f"\nagent saw: {peer.cmds()}; results: {out}")
            assert all(isinstance(r, dict) and r["state"] == "committed"
                       for r in out.values()), out
            cmds = peer.cmds()
            # Both COMMITs were received before either was answered (each
            # answer is followed by the snapshot.list checks): the two
            # protocols were in flight together, not one after the other.
            first_list = cmds.index("snapshot.list")
            assert cmds[:first_list].count("commit") == 2, cmds
            assert cmds[:first_list].count("prepare") == 2, cmds
            # One connection to the host, shared by both groups' calls.
            clients = [c for p in capture._pools.values() for c in p._clients.values()
                       if c.port == peer.port]
            assert len(clients) == 1 and clients[0].connects == 1, clients
        finally:
            with pg.sf() as s:
                g = s.get(Group, gid2)
                if g is not None:
                    s.delete(g)
                    s.commit()
