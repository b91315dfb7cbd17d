"""The control role never serves the API in plain HTTP beyond the machine:
it binds 127.0.0.1 (for a TLS reverse proxy in front), or it serves HTTPS
with the certificate it is given.  The role's listener tasks run for real
(ansible-playbook on localhost); `cutpoint server` serves HTTPS for real."""

from __future__ import annotations

import json
import os
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
ANSIBLE = ROOT / "ansible"
BIN = Path(sys.executable).parent


def _listen(tmp_path: Path, **extra: Any) -> tuple[int, dict[str, Any], str]:
    """Run the role's listener tasks with `extra` vars: (rc, facts, output)."""
    play = tmp_path / "listen.yml"
    play.write_text(json.dumps([{
        "name": "The control role's API listener is decided", "hosts": "localhost",
        "connection": "local", "gather_facts": False,
        "tasks": [{"name": "The listener tasks run",
                   "ansible.builtin.include_role": {"name": "cutpoint_control",
                                                    "tasks_from": "api_listen"}},
                  {"name": "The decision is written down", "ansible.builtin.copy": {
                      "dest": str(tmp_path / "decision.json"), "mode": "0600",
                      "content": "{{ {'args': cutpoint_control_api_args, "
                                 "'url': cutpoint_control_api_url} | to_json }}"}}]}]))
    env = dict(os.environ, PATH=f"{BIN}:{os.environ.get('PATH', '')}",
               ANSIBLE_CONFIG=str(ANSIBLE / "ansible.cfg"),
               ANSIBLE_LOCAL_TEMP="/tmp/.ansible-tmp", ANSIBLE_ROLES_PATH=str(ANSIBLE / "roles"))
    extra = {"ansible_python_interpreter": sys.executable, **extra}
    r = subprocess.run([str(BIN / "ansible-playbook"), "-i", "localhost,", str(play),
                        "-e", json.dumps(extra)], env=env, capture_output=True, text=True,
                       timeout=300, check=False)
    out = r.stdout + r.stderr
    decision = tmp_path / "decision.json"
    facts: dict[str, Any] = json.loads(decision.read_text()) if decision.exists() else {}
    if r.returncode != 0:
        facts["failed"] = out
    return r.returncode, facts, out


def test_the_api_binds_loopback_by_default(tmp_path: Path) -> None:
    rc, facts, out = _listen(tmp_path)
    print(f"\ndefaults: rc={rc} {facts}")
    assert rc == 0, out
    assert facts["args"] == "server --host 127.0.0.1 --port 8470", facts
    assert facts["url"] == "http://127.0.0.1:8470"


def test_plain_http_beyond_loopback_is_refused(tmp_path: Path) -> None:
    rc, facts, out = _listen(tmp_path, cutpoint_control_api_host="0.0.0.0")
    print(f"\n0.0.0.0 without TLS: rc={rc} {facts}")
    assert rc != 0, out
    assert "plain HTTP" in facts.get("failed", ""), out


def test_any_address_with_tls_serves_https(tmp_path: Path) -> None:
    rc, facts, out = _listen(tmp_path, cutpoint_control_api_host="0.0.0.0",
                             cutpoint_control_api_tls_cert_src="/x/api.pem",
                             cutpoint_control_api_tls_key_src="/x/api.key")
    print(f"\n0.0.0.0 with TLS: rc={rc} {facts}")
    assert rc == 0, out
    assert facts["args"] == ("server --host 0.0.0.0 --port 8470 "
                             "--tls-cert /etc/cutpoint/api-tls/api.pem "
                             "--tls-key /etc/cutpoint/api-tls/api.key"), facts
    assert facts["url"] == "https://127.0.0.1:8470"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def https_api(tmp_path: Path) -> Any:
    from cutpoint.agentclient.testing import make_pki

    pki = make_pki(tmp_path / "pki", {"control": ["127.0.0.1"]})
    env = dict(os.environ, CUTPOINT_DATABASE_URL=f"sqlite:///{tmp_path}/db.sqlite",
               CUTPOINT_TOKEN_SECRET="listen-test-secret-0123456789",
               CUTPOINT_REDIS_URL="redis://127.0.0.1:1/0")
    env.pop("CUTPOINT_CONFIG", None)
    port = _free_port()
    log = open(tmp_path / "api.log", "wb")  # noqa: SIM115 - closed in finally
    p = subprocess.Popen([str(BIN / "cutpoint"), "server", "--migrate", "--host", "127.0.0.1", "--port",
                          str(port), "--tls-cert", pki["control"]["cert"], "--tls-key",
                          pki["control"]["key"]], env=env, stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if p.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError((tmp_path / "api.log").read_text()) from None
                time.sleep(0.3)
        yield port, pki["ca"]["cert"]
    finally:
        p.terminate()
        p.wait(timeout=20)
        log.close()


def test_cutpoint_server_serves_https(https_api: tuple[int, str]) -> None:
    port, ca = https_api
    ctx = ssl.create_default_context(cafile=ca)
    with urllib.request.urlopen(f"https://127.0.0.1:{port}/healthz", context=ctx,
                                timeout=10) as r:
        assert json.load(r) == {"status": "ok"}
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10)
