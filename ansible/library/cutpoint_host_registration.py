#!/usr/bin/python
"""Register a hypervisor host with the cutpoint API, idempotently.

Reads the API's host list (and site list), compares with what is wanted, and
writes only on a difference: POST /v1/sites when the site is missing, POST
/v1/hosts when the host is missing, PATCH /v1/hosts/{id} when its address,
port or certificate fingerprint differ.  In check mode nothing is written and
`changed` says whether a write would have happened.
"""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: cutpoint_host_registration
short_description: Register a hypervisor host with the cutpoint control plane
description:
  - Reads C(GET /v1/hosts), compares, and creates or patches the host only on a
    difference. The site is created when it does not exist.
  - Supports check mode honestly (reports what would change, writes nothing).
options:
  api_url: {description: Base URL of the API., type: str, required: true}
  ca_file: {description: CA certificate (PEM) that signed the API's HTTPS certificate, when it is not in the system store., type: path}
  token: {description: Admin bearer token., type: str, no_log: true}
  token_file: {description: File holding the admin token (used when I(token) is empty)., type: path}
  name: {description: Host name., type: str, required: true}
  site: {description: Site (failure domain) name., type: str, required: true}
  address: {description: Agent address., type: str, required: true}
  port: {description: Agent port., type: int, default: 7443}
  cert_pem: {description: The agent certificate (PEM); its DER SHA-256 is registered as the host's pin., type: str}
  cert_fingerprint: {description: SHA-256 fingerprint (hex) when I(cert_pem) is not given; one of the two is required with I(state=present)., type: str}
  state: {description: present or absent., type: str, default: present, choices: [present, absent]}
author: cutpoint
"""

RETURN = r"""
host: {description: The host as the API returns it after the run (or as it would be in check mode)., type: dict, returned: always}
diff_fields: {description: Fields that differed., type: list, returned: always}
"""

import hashlib
import json
import ssl
import urllib.error
import urllib.parse
import urllib.request

from ansible.module_utils.basic import AnsibleModule


class ApiError(Exception):
    def __init__(self, method, path, sent, status, received):
        self.method, self.path, self.sent = method, path, sent
        self.status, self.received = status, received
        super().__init__(f"{method} {path} sent {sent!r} -> HTTP {status}: {received}")


# TLS context of HTTPS API URLs (set from ca_file in main).
_SSL = None


def _call(base, token, method, path, body=None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(base.rstrip("/") + path, data=data, method=method)
    req.add_header("Authorization", f"Bearer {token}")
    req.add_header("Accept", "application/json")
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=30, context=_SSL) as resp:
            raw = resp.read()
            return json.loads(raw) if raw else None
    except urllib.error.HTTPError as exc:
        raise ApiError(method, path, body, exc.code, exc.read().decode(errors="replace")) from exc
    except urllib.error.URLError as exc:
        raise ApiError(method, path, body, None, str(exc.reason)) from exc


def _list(base, token, path):
    items, cursor = [], None
    while True:
        q = {"limit": 500}
        if cursor:
            q["cursor"] = cursor
        page = _call(base, token, "GET", f"{path}?{urllib.parse.urlencode(q)}")
        items.extend(page["items"])
        cursor = page.get("next_cursor")
        if not cursor:
            return items


def fingerprint(cert_pem):
    """SHA-256 of the certificate's DER encoding, lower-case hex (the API's form)."""
    return hashlib.sha256(ssl.PEM_cert_to_DER_cert(cert_pem.strip() + "\n")).hexdigest()


def main():
    module = AnsibleModule(
        argument_spec={
            "api_url": {"type": "str", "required": True},
            "ca_file": {"type": "path"},
            "token": {"type": "str", "no_log": True, "default": ""},
            "token_file": {"type": "path"},
            "name": {"type": "str", "required": True},
            "site": {"type": "str", "required": True},
            "address": {"type": "str", "required": True},
            "port": {"type": "int", "default": 7443},
            "cert_pem": {"type": "str"},
            "cert_fingerprint": {"type": "str"},
            "state": {"type": "str", "default": "present", "choices": ["present", "absent"]},
        },
        supports_check_mode=True,
    )
    p = module.params
    global _SSL
    if p["ca_file"]:
        _SSL = ssl.create_default_context(cafile=p["ca_file"])
    token = p["token"]
    if not token:
        if not p["token_file"]:
            module.fail_json(msg="either token or token_file is required")
        try:
            with open(p["token_file"], encoding="utf-8") as f:
                token = f.read().strip()
        except OSError as exc:
            module.fail_json(msg=f"cannot read token_file {p['token_file']}: {exc}")
    fp = None
    if p["cert_pem"]:
        try:
            fp = fingerprint(p["cert_pem"])
        except ValueError as exc:
            module.fail_json(msg=f"cert_pem is not a PEM certificate: {exc}")
    elif p["cert_fingerprint"]:
        fp = p["cert_fingerprint"].replace(":", "").lower()
    if fp is None and p["state"] == "present":
        module.fail_json(msg="cert_pem or cert_fingerprint is required: the API registers a "
                             "host only pinned to its agent's certificate")

    base = p["api_url"]
    try:
        hosts = {h["name"]: h for h in _list(base, token, "/v1/hosts")}
        current = hosts.get(p["name"])
        if p["state"] == "absent":
            if current is None:
                module.exit_json(changed=False, host={}, diff_fields=[])
            if not module.check_mode:
                _call(base, token, "DELETE", f"/v1/hosts/{current['id']}")
            module.exit_json(changed=True, host={}, diff_fields=["state"],
                             diff={"before": current, "after": {}})
        want = {"site": p["site"], "address": p["address"], "port": p["port"],
                "cert_fingerprint": fp}
        if current is None:
            sites = {s["name"] for s in _list(base, token, "/v1/sites")}
            host = dict(want, name=p["name"])
            if not module.check_mode:
                if p["site"] not in sites:
                    _call(base, token, "POST", "/v1/sites", {"name": p["site"]})
                host = _call(base, token, "POST", "/v1/hosts", host)
            module.exit_json(changed=True, host=host, diff_fields=sorted(want),
                             diff={"before": {}, "after": host})
        if current["site"] != p["site"]:
            module.fail_json(msg=f"host {p['name']} is registered in site {current['site']}, "
                                 f"not {p['site']}; moving a host between sites is not done "
                                 "by this module (delete it first)", host=current)
        patch = {k: v for k, v in want.items() if k != "site" and current.get(k) != v}
        if not patch:
            module.exit_json(changed=False, host=current, diff_fields=[])
        after = dict(current, **patch)
        if not module.check_mode:
            after = _call(base, token, "PATCH", f"/v1/hosts/{current['id']}", patch)
        module.exit_json(changed=True, host=after, diff_fields=sorted(patch),
                         diff={"before": {k: current.get(k) for k in patch}, "after": patch})
    except ApiError as exc:
        module.fail_json(msg=str(exc), method=exc.method, path=exc.path, sent=exc.sent,
                         status=exc.status, received=exc.received)


if __name__ == "__main__":
    main()
