"""Fast checks of ansible/ (no lab): ansible-lint over the whole folder,
--syntax-check of every playbook, and the registration module against a real
cutpoint API (SQLite) — create, no-op second run, honest check mode, PATCH on
a new certificate."""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ANSIBLE = ROOT / "ansible"
BIN = Path(sys.executable).parent
PLAYBOOKS = ["site.yml", "add-host.yml", "rotate-certs.yml"]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{BIN}:{env.get('PATH', '')}"
    env["ANSIBLE_CONFIG"] = str(ANSIBLE / "ansible.cfg")
    env["ANSIBLE_LOCAL_TEMP"] = env["ANSIBLE_REMOTE_TEMP"] = "/tmp/.ansible-tmp"
    return env


def test_ansible_lint_passes_on_the_whole_folder() -> None:
    r = subprocess.run([str(BIN / "ansible-lint"), "--profile", "production"], cwd=ANSIBLE,
                       env=_env(), capture_output=True, text=True, timeout=600, check=False)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("playbook", PLAYBOOKS)
def test_playbook_syntax(playbook: str) -> None:
    r = subprocess.run([str(BIN / "ansible-playbook"), "-i", "inventory.example.yml",
                        "--syntax-check", playbook], cwd=ANSIBLE, env=_env(),
                       capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stdout + r.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture()
def api(tmp_path: Path):
    """A real cutpoint API on SQLite (no broker needed for hosts and sites)."""
    env = dict(os.environ, CUTPOINT_DATABASE_URL=f"sqlite:///{tmp_path}/db.sqlite",
               CUTPOINT_TOKEN_SECRET="ansible-test-secret-0123456789",
               CUTPOINT_REDIS_URL="redis://127.0.0.1:1/0")
    env.pop("CUTPOINT_CONFIG", None)
    cp = str(BIN / "cutpoint")
    subprocess.run([cp, "server", "migrate"], env=env, check=True, capture_output=True)
    tok = json.loads(subprocess.run([cp, "token", "create", "ansible", "--role", "admin", "--json"],
                                    env=env, check=True, capture_output=True, text=True).stdout)
    (tmp_path / "token").write_text(tok["token"] + "\n")
    port = _free_port()
    log = open(tmp_path / "api.log", "wb")  # noqa: SIM115 - closed in finally
    p = subprocess.Popen([cp, "server", "--host", "127.0.0.1", "--port", str(port)], env=env,
                         stdout=log, stderr=log)
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
        yield {"url": f"http://127.0.0.1:{port}", "token_file": str(tmp_path / "token"),
               "token": tok["token"]}
    finally:
        p.terminate()
        p.wait(timeout=20)
        log.close()


def _cert(tmp_path: Path, name: str) -> str:
    ca = tmp_path / f"ca-{name}"
    subprocess.run([str(ROOT / "scripts" / "make-lab-ca.sh"), str(ca)], check=True)
    subprocess.run([str(ROOT / "scripts" / "make-lab-ca.sh"), str(ca), "issue", name, "agent", "10.78.0.9"],
                   check=True)
    return (ca / f"{name}.pem").read_text()


def _module(api: dict, cert_pem: str, *, check: bool = False) -> tuple[bool, dict]:
    args = {"api_url": api["url"], "token_file": api["token_file"], "name": "hv1",
            "site": "primary", "address": "10.78.0.9", "port": 7443, "cert_pem": cert_pem}
    cmd = [str(BIN / "ansible"), "localhost", "-c", "local", "-m", "cutpoint_host_registration",
           "-a", json.dumps(args)]
    if check:
        cmd.append("--check")
    r = subprocess.run(cmd, cwd=ANSIBLE, env=_env(), capture_output=True, text=True, timeout=120,
                       check=False)
    m = re.search(r"localhost \| (CHANGED|SUCCESS) => (\{.*\})", r.stdout, re.DOTALL)
    assert r.returncode == 0 and m, r.stdout + r.stderr
    return m.group(1) == "CHANGED", json.loads(m.group(2))


def _hosts(api: dict) -> list[dict]:
    import urllib.request
    req = urllib.request.Request(api["url"] + "/v1/hosts",
                                 headers={"Authorization": f"Bearer {api['token']}"})
    with urllib.request.urlopen(req) as resp:
        return list(json.load(resp)["items"])


def _fp(pem: str) -> str:
    return hashlib.sha256(ssl.PEM_cert_to_DER_cert(pem)).hexdigest()


def test_registration_module_reads_compares_and_writes_only_on_difference(
        api: dict, tmp_path: Path) -> None:
    pem1, pem2 = _cert(tmp_path, "hv1"), _cert(tmp_path, "hv1b")
    # Check mode on an empty API: would change, writes nothing.
    changed, _ = _module(api, pem1, check=True)
    assert changed and _hosts(api) == []
    # Real run: creates site and host with the certificate's fingerprint.
    changed, _ = _module(api, pem1)
    hosts = _hosts(api)
    assert changed and [(h["name"], h["site"], h["cert_fingerprint"]) for h in hosts] == \
        [("hv1", "primary", _fp(pem1))]
    # Second run: no difference, no write.
    changed, res = _module(api, pem1)
    assert not changed and res["diff_fields"] == []
    assert _hosts(api)[0]["version"] == hosts[0]["version"]
    # A rotated certificate: check mode reports the change and writes nothing...
    changed, res = _module(api, pem2, check=True)
    assert changed and res["diff_fields"] == ["cert_fingerprint"]
    assert _hosts(api)[0]["cert_fingerprint"] == _fp(pem1)
    # ...the real run patches exactly that field.
    changed, _ = _module(api, pem2)
    assert changed and _hosts(api)[0]["cert_fingerprint"] == _fp(pem2)


def _site(api: dict, *, check_mode: bool = False, **kw: object) -> tuple[str, dict]:
    args = {"api_url": api["url"], "token_file": api["token_file"], "name": "dr", **kw}
    cmd = [str(BIN / "ansible"), "localhost", "-c", "local", "-m", "cutpoint_site",
           "-a", json.dumps(args)]
    if check_mode:
        cmd.append("--check")
    r = subprocess.run(cmd, cwd=ANSIBLE, env=_env(), capture_output=True, text=True, timeout=180,
                       check=False)
    m = re.search(r"localhost \| (CHANGED|SUCCESS|FAILED!) => (\{.*\})", r.stdout, re.DOTALL)
    assert m, r.stdout + r.stderr
    return m.group(1), json.loads(m.group(2))


def _sites(api: dict) -> list[dict]:
    import urllib.request
    req = urllib.request.Request(api["url"] + "/v1/sites",
                                 headers={"Authorization": f"Bearer {api['token']}"})
    with urllib.request.urlopen(req) as resp:
        return list(json.load(resp)["items"])


def test_site_module_reads_compares_and_writes_only_on_difference(
        api: dict, tmp_path: Path) -> None:
    """No Ceph cluster here: the API's check of a missing ceph.conf fails the
    task naming the check; `check: false` registers the site (a cluster not
    up yet); then only differences are written, honestly in check mode."""
    key = "AQBmDUlnAAAAABAAp9n3yQ4bC4YVb9QkzQ3xYw=="
    kr = tmp_path / "dr.client.cutpoint.keyring"
    kr.write_text(f"[client.cutpoint]\n\tkey = {key}\n")
    ceph = {"ceph_conf": "/nonexistent/dr.conf", "keyring": str(kr), "pools": {"rbd": "rbd"}}
    # The check runs by default and refuses: nothing stored.
    state, res = _site(api, ceph=ceph)
    assert state == "FAILED!" and res["failed_check"] == "connect", res
    assert res["ceph_code"] == "ceph_not_found" and _sites(api) == []
    # Check mode on an empty API: would change, writes nothing.
    state, _ = _site(api, ceph=ceph, check_mode=True)
    assert state == "CHANGED" and _sites(api) == []
    state, res = _site(api, ceph=ceph, description="DR", check=False)
    assert state == "CHANGED", res
    [site] = _sites(api)
    assert site["ceph"]["keyring"] == str(kr) and site["ceph"]["client_id"] == "cutpoint"
    # Second run: the API's defaults compare equal, no write.
    state, res = _site(api, ceph=ceph, description="DR", check=False)
    assert state == "SUCCESS" and res["diff_fields"] == [], res
    assert _sites(api)[0]["version"] == site["version"]
    # A changed timeout: reported in check mode, written by the real run.
    more = dict(ceph, op_timeout_s=20)
    state, res = _site(api, ceph=more, description="DR", check=False, check_mode=True)
    assert state == "CHANGED" and res["diff_fields"] == ["ceph.op_timeout_s"], res
    assert _sites(api)[0]["ceph"]["op_timeout_s"] == 30
    state, res = _site(api, ceph=more, description="DR", check=False)
    assert state == "CHANGED" and _sites(api)[0]["ceph"]["op_timeout_s"] == 20, res
    # A checked change fails the task, naming the check; the site is unchanged.
    state, res = _site(api, ceph=dict(more, op_timeout_s=25), description="DR")
    assert state == "FAILED!" and res["failed_check"] == "connect", res
    assert _sites(api)[0]["ceph"]["op_timeout_s"] == 20
    assert key not in json.dumps(res)


def _hello(args: dict) -> tuple[bool, dict]:
    r = subprocess.run([str(BIN / "ansible"), "localhost", "-c", "local", "-m",
                        "cutpoint_agent_hello", "-a", json.dumps(args)], cwd=ANSIBLE, env=_env(),
                       capture_output=True, text=True, timeout=120, check=False)
    m = re.search(r"localhost \| (SUCCESS|FAILED!) => (\{.*\})", r.stdout, re.DOTALL)
    assert m, r.stdout + r.stderr
    return m.group(1) == "SUCCESS", json.loads(m.group(2))


def test_hello_module_against_a_real_agent(tmp_path: Path) -> None:
    """The health-check module: hello accepted with the deployment's
    coordinator certificate, refused in the handshake with one from another CA
    (what rotate-certs.yml relies on)."""
    agent = ROOT / "build" / "agent" / "cutpointd"
    if not agent.is_file():
        pytest.skip("build/agent/cutpointd is not built")
    ca, other = tmp_path / "ca", tmp_path / "other"
    script = str(ROOT / "scripts" / "make-lab-ca.sh")
    for d in (ca, other):
        subprocess.run([script, str(d)], check=True)
        subprocess.run([script, str(d), "issue", "coordinator", "coordinator"], check=True)
    subprocess.run([script, str(ca), "issue", "hv1", "agent", "127.0.0.1"], check=True)
    port = _free_port()
    cfg = tmp_path / "agent.ini"
    cfg.write_text(f"[agent]\nhost = hv1\nlisten = 127.0.0.1:{port}\njournal = {tmp_path}/journal\n"
                   f"[tls]\nca = {ca}/ca.pem\ncert = {ca}/hv1.pem\nkey = {ca}/hv1.key\n")
    log = open(tmp_path / "agent.log", "wb")  # noqa: SIM115 - closed in finally
    p = subprocess.Popen([str(agent), "-c", str(cfg)], stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert p.poll() is None and time.monotonic() < deadline, \
                    (tmp_path / "agent.log").read_text()
                time.sleep(0.1)
        base = {"host": "127.0.0.1", "port": port, "ca": f"{ca}/ca.pem", "expect_host": "hv1"}
        ok, res = _hello(dict(base, cert=f"{ca}/coordinator.pem", key=f"{ca}/coordinator.key"))
        assert ok and res["hello"]["host"] == "hv1" and res["hello"]["protocol"] == 1, res
        assert res["peer_fingerprint"] == _fp((ca / "hv1.pem").read_text())
        assert res["changed"] is False
        ok, res = _hello(dict(base, cert=f"{other}/coordinator.pem", key=f"{other}/coordinator.key"))
        # TLS 1.3 checks the client certificate after the client's side of
        # the handshake is done: the client reads either the agent's
        # unknown_ca alert or, when the agent has already closed, an EOF.
        # Both are a refusal; no hello reply ever comes.
        assert not ok and ("UNKNOWN_CA" in res["msg"]
                           or "EOF occurred in violation of protocol" in res["msg"]), res
        assert "hello" not in res, res
        ok, res = _hello(dict(base, cert=f"{ca}/coordinator.pem", key=f"{ca}/coordinator.key",
                              expect_host="hv9"))
        assert not ok and "expected 'hv9'" in res["msg"], res
    finally:
        p.terminate()
        p.wait(timeout=20)
        log.close()
