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
import ssl

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.cutpoint_api import (
    ApiError,
    call,
    configure_tls,
    list_all,
    read_token,
)


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
    configure_tls(module)
    token = read_token(module)
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
        hosts = {h["name"]: h for h in list_all(base, token, "/v1/hosts")}
        current = hosts.get(p["name"])
        if p["state"] == "absent":
            if current is None:
                module.exit_json(changed=False, host={}, diff_fields=[])
            if not module.check_mode:
                call(base, token, "DELETE", f"/v1/hosts/{current['id']}")
            module.exit_json(changed=True, host={}, diff_fields=["state"],
                             diff={"before": current, "after": {}})
        want = {"site": p["site"], "address": p["address"], "port": p["port"],
                "cert_fingerprint": fp}
        if current is None:
            sites = {s["name"] for s in list_all(base, token, "/v1/sites")}
            host = dict(want, name=p["name"])
            if not module.check_mode:
                if p["site"] not in sites:
                    call(base, token, "POST", "/v1/sites", {"name": p["site"]})
                host = call(base, token, "POST", "/v1/hosts", host)
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
            after = call(base, token, "PATCH", f"/v1/hosts/{current['id']}", patch)
        module.exit_json(changed=True, host=after, diff_fields=sorted(patch),
                         diff={"before": {k: current.get(k) for k in patch}, "after": patch})
    except ApiError as exc:
        module.fail_json(msg=str(exc), method=exc.method, path=exc.path, sent=exc.sent,
                         status=exc.status, received=exc.received)


if __name__ == "__main__":
    main()
