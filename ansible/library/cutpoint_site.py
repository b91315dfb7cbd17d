#!/usr/bin/python
"""Register a site and its Ceph access with the cutpoint API, idempotently.

Reads the API's site list, compares the description and every field of the
Ceph access (after the API's defaults) with what is wanted, and writes only
on a difference: POST /v1/sites when the site is missing, PATCH
/v1/sites/{id} with just the fields that differ.  The API runs the site
check on every write of a Ceph access; a failed check fails the task with
the check and its Ceph code.  In check mode nothing is written and
`changed` says whether a write would have happened.
"""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: cutpoint_site
short_description: Register a site and its Ceph access with the cutpoint control plane
description:
  - Reads C(GET /v1/sites), compares, and creates or patches the site only on a
    difference. The API checks a new or changed Ceph access (connect, pools,
    snapshot, write, diff) before it stores it, unless I(check) is false.
  - The keyring is given by path; its key never passes through this module.
  - Supports check mode honestly (reports what would change, writes nothing).
options:
  api_url: {description: Base URL of the API., type: str, required: true}
  token: {description: Admin bearer token., type: str, no_log: true}
  token_file: {description: File holding the admin token (used when I(token) is empty)., type: path}
  ca_file: {description: CA certificate (PEM) that signed the API's HTTPS certificate, when it is not in the system store., type: path}
  validate_certs: {description: Check the API's HTTPS certificate; false only for the control machine's own listener over loopback., type: bool, default: true}
  name: {description: Site name., type: str, required: true}
  description: {description: Free text., type: str, default: ""}
  ceph:
    description:
      - The site's Ceph access; omitted, the site's access is left as it is.
      - Keys ceph_conf or mon_host (one of them), client_id (default cutpoint),
        keyring (a path), pools (logical -> pool at this site),
        connect_timeout_s, op_timeout_s, bulk_timeout_s.
    type: dict
  check: {description: Let the API run the site check before it stores a changed access., type: bool, default: true}
  state: {description: present or absent., type: str, default: present, choices: [present, absent]}
author: cutpoint
"""

RETURN = r"""
site: {description: The site as the API returns it after the run (or as it would be in check mode)., type: dict, returned: always}
diff_fields: {description: Fields that differed (ceph.<field> for the Ceph access)., type: list, returned: always}
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.cutpoint_api import (
    ApiError,
    call,
    configure_tls,
    list_all,
    read_token,
)

# The API's defaults: a field the inventory leaves out compares equal to these.
DEFAULTS = {"ceph_conf": None, "mon_host": None, "client_id": "cutpoint", "keyring": None,
            "connect_timeout_s": 10, "op_timeout_s": 30, "bulk_timeout_s": 900}
FIELDS = (*DEFAULTS, "pools")


def wanted_access(ceph):
    unknown = sorted(set(ceph) - set(FIELDS))
    if unknown:
        raise ValueError(f"unknown ceph key(s) {unknown}; known: {sorted(FIELDS)}")
    if not ceph.get("pools"):
        raise ValueError("ceph.pools is required (logical pool -> pool at this site)")
    out = {k: ceph.get(k, v) for k, v in DEFAULTS.items()}
    out["pools"] = {str(k): str(v) for k, v in ceph["pools"].items()}
    if out["mon_host"] is not None:
        out["mon_host"] = [str(m) for m in out["mon_host"]]
    for k in ("connect_timeout_s", "op_timeout_s", "bulk_timeout_s"):
        out[k] = int(out[k])
    return out


def failure(module, exc):
    prob = exc.problem() or {}
    if prob.get("code") == "site_check_failed":
        where = f" (pool {prob['failed_pool']})" if prob.get("failed_pool") else ""
        module.fail_json(msg=f"site check failed at {prob.get('failed_check')}{where}: "
                             f"{prob.get('ceph_code')}: {prob.get('detail')}",
                         failed_check=prob.get("failed_check"), ceph_code=prob.get("ceph_code"),
                         checks=prob.get("checks"), status=exc.status)
    module.fail_json(msg=str(exc), method=exc.method, path=exc.path, sent=exc.sent,
                     status=exc.status, received=exc.received)


def main():
    module = AnsibleModule(
        argument_spec={
            "api_url": {"type": "str", "required": True},
            "token": {"type": "str", "no_log": True, "default": ""},
            "token_file": {"type": "path"},
            "ca_file": {"type": "path"},
            "validate_certs": {"type": "bool", "default": True},
            "name": {"type": "str", "required": True},
            "description": {"type": "str", "default": ""},
            "ceph": {"type": "dict"},
            "check": {"type": "bool", "default": True},
            "state": {"type": "str", "default": "present", "choices": ["present", "absent"]},
        },
        supports_check_mode=True,
    )
    p = module.params
    configure_tls(module)
    token = read_token(module)
    try:
        want = wanted_access(p["ceph"]) if p["ceph"] is not None else None
    except ValueError as exc:
        module.fail_json(msg=str(exc))
    base = p["api_url"]
    try:
        current = next((s for s in list_all(base, token, "/v1/sites")
                        if s["name"] == p["name"]), None)
        if p["state"] == "absent":
            if current is None:
                module.exit_json(changed=False, site={}, diff_fields=[])
            if not module.check_mode:
                call(base, token, "DELETE", f"/v1/sites/{current['id']}")
            module.exit_json(changed=True, site={}, diff_fields=["state"],
                             diff={"before": current, "after": {}})
        if current is None:
            body = {"name": p["name"], "description": p["description"], "check": p["check"]}
            if want is not None:
                body["ceph"] = want
            site = dict(body, ceph=want)
            if not module.check_mode:
                site = call(base, token, "POST", "/v1/sites", body, timeout=600)
            module.exit_json(changed=True, site=site,
                             diff_fields=["description"] + [f"ceph.{k}" for k in want or {}],
                             diff={"before": {}, "after": site})
        patch, diff_fields = {}, []
        if current["description"] != p["description"]:
            patch["description"] = p["description"]
            diff_fields.append("description")
        if want is not None:
            have = current.get("ceph") or {}
            ceph = {k: v for k, v in want.items() if have.get(k) != v} if have else dict(want)
            if ceph:
                patch["ceph"] = ceph
                diff_fields += [f"ceph.{k}" for k in sorted(ceph)]
        if not patch:
            module.exit_json(changed=False, site=current, diff_fields=[])
        after = dict(current, **patch)
        if "ceph" in patch:
            after["ceph"] = {**(current.get("ceph") or {}), **patch["ceph"]}
        patch["check"] = p["check"]
        if not module.check_mode:
            after = call(base, token, "PATCH", f"/v1/sites/{current['id']}", patch, timeout=600)
        module.exit_json(changed=True, site=after, diff_fields=diff_fields,
                         diff={"before": {k: current.get(k) for k in patch if k != "check"},
                               "after": {k: v for k, v in patch.items() if k != "check"}})
    except ApiError as exc:
        failure(module, exc)


if __name__ == "__main__":
    main()
