"""An abort whose cleanup is not confirmed is `aborting`, never `aborted`,
and the worker finishes it when it starts, with no new snapshot of the group.

Agents are in-process protocol peers (real mutual TLS); the fault is one
switch: an agent answers ABORT with an error (or is unreachable) after the
commit failed elsewhere, so its member snapshot is still there.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cutpoint.api import services_local
from cutpoint.api.migrate import upgrade
from cutpoint.api.models import GroupSnapshot, Role
from cutpoint.api.services import capture, tokens
from liveapi import cli, serve  # api/tests/liveapi.py
from peergroup import SECRET, PeerGroup  # api/tests/peergroup.py
from plane import Plane, wait_for  # api/tests/plane.py
from sqlalchemy import func, select

HOSTS = {"h1": {"vm1": ["disk0"]}, "h2": {"vm2": ["disk0"]}}


def _fail_commit_and_abort(pg: PeerGroup, how: str) -> None:
    """h2's snapshot fails, so the group aborts after COMMIT; h1 made its
    snapshot and cannot clean it up: it answers ABORT with an error, or it
    is unreachable by then (it hangs up on every request after COMMIT)."""
    h1, h2 = pg.peers["h1"], pg.peers["h2"]
    h2.fail_snapshot = {f"vm2-{pg.tag}/disk0"}
    if how == "error":
        h1.refuse = {"abort": "INTERNAL"}
    else:
        def gone(req: dict[str, object]) -> None:
            if req.get("cmd") == "commit":
                h1.hang = {"abort", "snapshot.list", "snapshot.delete"}
        h1.on_request = gone


def _leftover(pg: PeerGroup) -> set[str]:
    return {n for names in pg.peers["h1"].all_snapshots().values() for n in names}


@pytest.mark.parametrize("how", ["error", "unreachable"])
def test_an_abort_whose_cleanup_fails_shows_aborting(
        how: str, db_url: str, local_services: services_local.Endpoints,
        tmp_path: Path) -> None:
    with PeerGroup(db_url, local_services.redis_url, tmp_path, HOSTS) as pg:
        _fail_commit_and_abort(pg, how)
        _, sid = pg.request()
        out = capture.run(pg.sf, pg.settings, sid)
        left = _leftover(pg)
        print(f"\n{how}: capture -> {out['state']}; left on h1: {sorted(left)}")
        assert left, "the fault left no member snapshot: nothing to clean up"
        assert out["state"] == "aborting", out
        with pg.sf() as s:
            _, tok = tokens.create(s, f"viewer-{pg.tag}", Role.viewer, SECRET)
        with serve(pg.settings) as url:
            rc, text = cli("group", "snapshot-show", str(sid), "--url", url, "--token", tok)
            rc2, body = cli("group", "snapshot-show", str(sid), "--json", "--url", url,
                             "--token", tok)
        print(text)
        assert rc == 0 and "state=aborting" in text and "cleanup" in text, text
        assert rc2 == 0, body
        doc = json.loads(body)
        assert doc["state"] == "aborting" and doc["finished_at"] is None, doc
        assert {m["state"] for m in doc["members"]} == {"deleting"}, doc["members"]


def test_a_worker_started_with_an_aborting_txn_resolves_it(
        local_services: services_local.Endpoints, tmp_path: Path) -> None:
    """The agent comes back, a worker starts (no beat, so no new snapshot of
    the group): the txn is resolved, its member snapshot deleted, and the
    snapshot becomes `aborted`."""
    db = f"sqlite:///{tmp_path}/cp.db"
    upgrade(db)
    with PeerGroup(db, local_services.redis_url, tmp_path, HOSTS) as pg:
        _fail_commit_and_abort(pg, "error")
        _, sid = pg.request()
        assert capture.run(pg.sf, pg.settings, sid)["state"] in ("aborting", "aborted")
        assert _leftover(pg)
        pg.peers["h1"].refuse = {}  # the agent can clean up again
        certs = {"CUTPOINT_AGENT_CA": pg.pki["ca"]["cert"],
                 "CUTPOINT_AGENT_CERT": pg.pki["coordinator"]["cert"],
                 "CUTPOINT_AGENT_KEY": pg.pki["coordinator"]["key"]}
        with Plane(tmp_path, int(local_services.redis_port or 0), certs, db=db,
                   CUTPOINT_GROUP_LOCK_TTL_S="6") as plane:
            plane.start("worker")

            def state() -> str:
                with plane.sf() as s:
                    snap = s.get(GroupSnapshot, sid)
                    assert snap is not None
                    return snap.state.value
            wait_for(lambda: state() == "aborted" and not _leftover(pg), 60,
                     "the aborting txn to be resolved", plane)
            with plane.sf() as s:
                n = s.scalar(select(func.count()).select_from(GroupSnapshot).where(
                    GroupSnapshot.group_id == pg.gid))
                snap = s.get(GroupSnapshot, sid)
                assert snap is not None
                members = {m.state for m in snap.members}
                finished = snap.finished_at
        print(f"\nresolved at worker start: state={state()} members={members} "
              f"snapshots of the group={n}")
        assert n == 1 and members == {"deleted"} and finished is not None
        assert "abort" in pg.peers["h1"].cmds()[-3:] or "snapshot.delete" in \
            pg.peers["h1"].cmds()
