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
