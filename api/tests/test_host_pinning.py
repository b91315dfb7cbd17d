"""Every agent the control plane talks to is pinned: a host is registered
only with its certificate's fingerprint (API and CLI)."""

from __future__ import annotations

import hashlib
import ssl
from pathlib import Path
from typing import Any

from cutpoint.agentclient.testing import make_pki
from liveapi import cli, serve  # api/tests/liveapi.py

HOST = {"name": "h", "site": "s", "address": "10.0.0.1", "port": 7443}


def _fp(pem: str) -> str:
    return hashlib.sha256(ssl.PEM_cert_to_DER_cert(Path(pem).read_text())).hexdigest()


def test_the_api_refuses_a_host_without_a_pin(api: Any) -> None:
    assert api.post("/v1/sites", json={"name": "s"}).status_code == 201
    r = api.post("/v1/hosts", json=HOST)
    print(f"\nPOST /v1/hosts without cert_fingerprint -> {r.status_code} {r.text}")
    assert r.status_code == 422, r.text
    body = r.json()
    assert r.headers["content-type"] == "application/problem+json"
    assert body["code"] == "validation_error"
    assert body["detail"] == "body.cert_fingerprint: Field required", body
    assert api.get("/v1/hosts").json()["items"] == []
    r = api.post("/v1/hosts", json={**HOST, "cert_fingerprint": None})
    assert r.status_code == 422 and "cert_fingerprint" in r.json()["detail"], r.text
    r = api.post("/v1/hosts", json={**HOST, "cert_fingerprint": "AB:" * 31 + "CD"})
    assert r.status_code == 201, r.text
    assert r.json()["cert_fingerprint"] == "ab" * 31 + "cd"
    # A pin can be replaced, never removed.
    hid = r.json()["id"]
    r = api.patch(f"/v1/hosts/{hid}", json={"cert_fingerprint": None})
    assert r.status_code == 200, r.text
    assert api.get(f"/v1/hosts/{hid}").json()["cert_fingerprint"] == "ab" * 31 + "cd"


def test_the_cli_registers_a_host_only_with_its_pin(api: Any, settings: Any,
                                                    session_factory: Any,
                                                    tokens_by_role: dict[str, str],
                                                    tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki", {"h": ["10.0.0.1"]})
    assert api.post("/v1/sites", json={"name": "s"}).status_code == 201
    with serve(settings, session_factory) as url:
        opts = ["--url", url, "--token", tokens_by_role["admin"]]
        add = ["host", "add", "h", "--site", "s", "--address", "10.0.0.1", "--no-sync"]
        rc, out = cli(*add, *opts)
        print(f"\ncutpoint host add without a pin -> rc={rc}\n{out}")
        assert rc == 2, out
        assert "--cert" in out and "--fingerprint" in out, out
        assert api.get("/v1/hosts").json()["items"] == []
        rc, out = cli(*add, "--cert", str(tmp_path / "nope.pem"), *opts)
        assert rc == 2 and "nope.pem" in out, out
        rc, out = cli(*add, "--cert", pki["h"]["cert"], *opts)
        assert rc == 0, out
    (h,) = api.get("/v1/hosts").json()["items"]
    assert h["cert_fingerprint"] == _fp(pki["h"]["cert"])


def test_a_changed_pin_is_not_reached_over_an_old_connection(
        db_url: str, local_services: Any, tmp_path: Path) -> None:
    """The worker keeps agent connections open across snapshots.  When a
    host's pin changes (its certificate was re-issued, say because the old
    key leaked), the next snapshot must check the new pin: the connection
    opened under the old one is not used again."""
    from cutpoint.api.models import Host, SnapState
    from cutpoint.api.services import capture
    from peergroup import PeerGroup  # api/tests/peergroup.py

    with PeerGroup(db_url, local_services.redis_url, tmp_path,
                   {"h1": {"vm1": ["disk0"]}}) as pg:
        _, sid = pg.request()
        assert capture.run(pg.sf, pg.settings, sid)["state"] == "committed"
        other = make_pki(tmp_path / "other", {"elsewhere": ["127.0.0.1"]})
        with pg.sf() as s:
            (h,) = s.query(Host).filter(Host.site_id == pg.site_id).all()
            h.cert_fingerprint = _fp(other["elsewhere"]["cert"])  # not what the agent has
            s.commit()
        _, sid2 = pg.request()
        out = capture.run(pg.sf, pg.settings, sid2)
        print(f"\nafter the pin changed: {out['state']} {out['error_code']}: {out['reason']}")
        assert out["state"] == SnapState.aborted.value, out
        assert out["error_code"] == "CERT_MISMATCH", out
        assert pg.peers["h1"].cmds().count("prepare") == 1  # only the first snapshot's


def test_failover_agent_calls_are_pinned(tmp_path: Path, settings: Any) -> None:
    """Failover's calls to agents (fence: vm.stop on the primary's hosts;
    boot: vm.start on the DR host) go through one pinned connection helper
    (services/agents.py): the right certificate is reached, another one
    signed by the same CA is refused before any request is sent, and a host
    without a pin is not called at all."""
    import asyncio
    import threading

    from cutpoint.agentclient.testing import AgentPeer
    from cutpoint.api.models import Host
    from cutpoint.api.services import agents

    pki = make_pki(tmp_path / "pki", {"dr1": ["127.0.0.1"], "other": ["127.0.0.1"],
                                      "coordinator": []})
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    peer = AgentPeer("dr1", {"vm1": ["disk0"]}, ca=pki["ca"]["cert"],
                     cert=pki["dr1"]["cert"], key=pki["dr1"]["key"])
    asyncio.run_coroutine_threadsafe(peer.start(), loop).result(10)
    st = settings.model_copy(update={"agent_ca": pki["ca"]["cert"],
                                     "agent_cert": pki["coordinator"]["cert"],
                                     "agent_key": pki["coordinator"]["key"],
                                     "agent_timeout_s": 5})

    def host(pin: str | None) -> Host:
        return Host(name="dr1", address="127.0.0.1", port=peer.port, cert_fingerprint=pin)
    try:
        right, wrong = _fp(pki["dr1"]["cert"]), _fp(pki["other"]["cert"])
        # Fence: vm.stop through agents.call.
        for pin, code in ((None, "unpinned"), (wrong, "fingerprint_mismatch")):
            try:
                agents.call(host(pin), st, ("vm.stop", {"vm": "vm1"}))
                got = "sent"
            except agents.AgentCallError as exc:
                got = exc.code
            print(f"\nvm.stop with pin {pin and pin[:8]}: {got}; agent saw {peer.cmds()}")
            assert got == code and peer.requests == [], peer.cmds()
        # Boot: vm.start of each VM, per-VM outcome (the peer has no vm.start:
        # its UNKNOWN_COMMAND reply shows the request reached it).
        started, errors = agents.start_vms(host(right), st, ["vm1"], timeout_s=5)
        assert started == {} and "UNKNOWN_COMMAND" in errors[0], errors
        assert peer.cmds() == ["vm.start"]
        for pin, code in ((None, "unpinned"), (wrong, "fingerprint_mismatch")):
            started, errors = agents.start_vms(host(pin), st, ["vm1"], timeout_s=5)
            assert started == {} and code in errors[0], errors
        assert peer.cmds() == ["vm.start"]
    finally:
        asyncio.run_coroutine_threadsafe(peer.stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
