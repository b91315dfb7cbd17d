#!/usr/bin/python
"""Install a Ceph client key into libvirt as a secret of usage type ceph.

The key is read on the target from a Ceph keyring file, which the caller
names by path: it never travels through a module argument, a registered
variable or the module's result, so no Ansible log (-v, callbacks) can show
it.  Idempotent: the secret is defined only when it is missing or its XML
differs, and its value is set only when libvirt's differs from the keyring's
(read back with `virsh secret-get-value`, which is why the secret is not
`private`: root on the host can read the keyring anyway).
"""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: cutpoint_libvirt_secret
short_description: A Ceph client key as a libvirt secret (usage type ceph), from a keyring file
description:
  - Defines the secret with a fixed UUID when it is missing or differs, and sets its value from the
    entity's key in a keyring file on the target when libvirt's value differs. Supports check mode.
    The key never appears in arguments or results.
options:
  uri: {description: libvirt connection URI., type: str, default: "qemu:///system"}
  uuid: {description: The secret's UUID (domain XML refers to it in <auth><secret uuid=...>)., type: str, required: true}
  usage: {description: "The secret's usage name (virsh secret-list shows C(ceph <usage>))." , type: str, required: true}
  keyring: {description: Ceph keyring file on the target that holds the key., type: path, required: true}
  entity: {description: "The keyring section whose C(key) is the value, e.g. C(client.admin).", type: str, required: true}
  description: {description: The secret's description., type: str, default: cutpoint Ceph client key}
author: cutpoint
"""

RETURN = r"""
defined: {description: The secret was (or in check mode would be) defined or redefined., type: bool, returned: always}
value_set: {description: Its value was (or would be) set., type: bool, returned: always}
"""

import base64
import binascii
import os
import re
import shutil
import tempfile
import uuid as uuidlib
import xml.etree.ElementTree as ET
from xml.sax.saxutils import escape

from ansible.module_utils.basic import AnsibleModule


def keyring_key(path, entity):
    """The entity's key from a Ceph keyring (INI: [client.x] / key = ...)."""
    section = None
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            m = re.fullmatch(r"\[(.+)\]", line)
            if m:
                section = m.group(1).strip()
                continue
            m = re.fullmatch(r"key\s*=\s*(\S+)", line)
            if m and section == entity:
                return m.group(1)
    return None


def wanted_xml(uuid, usage, description):
    return (f"<secret ephemeral='no' private='no'>\n"
            f"  <uuid>{uuid}</uuid>\n"
            f"  <description>{escape(description)}</description>\n"
            f"  <usage type='ceph'>\n    <name>{escape(usage)}</name>\n  </usage>\n"
            f"</secret>\n")


def differs(current, uuid, usage, description):
    """What of the defined secret's XML is not as wanted ([] if nothing)."""
    root = ET.fromstring(current)
    u = root.find("usage")
    have = {"uuid": root.findtext("uuid", ""), "ephemeral": root.get("ephemeral", "no"),
            "private": root.get("private", "no"), "description": root.findtext("description", ""),
            "usage_type": u.get("type", "") if u is not None else "",
            "usage": u.findtext("name", "") if u is not None else ""}
    want = {"uuid": uuid, "ephemeral": "no", "private": "no", "description": description,
            "usage_type": "ceph", "usage": usage}
    return sorted(k for k in want if have[k] != want[k])


def main():
    mod = AnsibleModule(argument_spec={
        "uri": {"type": "str", "default": "qemu:///system"},
        "uuid": {"type": "str", "required": True},
        "usage": {"type": "str", "required": True},
        "keyring": {"type": "path", "required": True},
        "entity": {"type": "str", "required": True},
        "description": {"type": "str", "default": "cutpoint Ceph client key"},
    }, supports_check_mode=True)
    p = mod.params
    try:
        uuid = str(uuidlib.UUID(p["uuid"]))
    except ValueError:
        mod.fail_json(msg=f"uuid {p['uuid']!r} is not a UUID")
    if not p["usage"].strip():
        mod.fail_json(msg="usage must not be empty")

    def virsh(*args, check=True):
        rc, out, err = mod.run_command(["virsh", "-c", p["uri"], *args])
        if check and rc != 0:
            mod.fail_json(msg=f"virsh -c {p['uri']} {args[0]} {uuid}: {err.strip() or out.strip()}")
        return rc, out, err

    try:
        key = keyring_key(p["keyring"], p["entity"])
    except OSError as e:
        mod.fail_json(msg=f"keyring {p['keyring']}: {e.strerror}")
    if not key:
        mod.fail_json(msg=f"keyring {p['keyring']} has no key for [{p['entity']}]")
    try:
        base64.b64decode(key, validate=True)
    except (binascii.Error, ValueError):
        mod.fail_json(msg=f"keyring {p['keyring']}: the key of [{p['entity']}] is not base64")

    xml = wanted_xml(uuid, p["usage"], p["description"])
    rc, out, err = virsh("secret-dumpxml", uuid, check=False)
    if rc == 0:
        diff = differs(out, uuid, p["usage"], p["description"])
    elif "no secret with matching uuid" in err.lower() or "not found" in err.lower():
        diff = ["missing"]
    else:
        mod.fail_json(msg=f"virsh -c {p['uri']} secret-dumpxml {uuid}: {err.strip()}")
    if "private" in diff:
        # libvirt keeps the private flag of an existing secret, and a private
        # value cannot be read back to compare
        mod.fail_json(msg=f"secret {uuid} exists and is private: its value cannot be compared; "
                          "undefine it (virsh secret-undefine) or use another UUID")
    value_differs = True
    if not diff:
        rc, out, _ = virsh("secret-get-value", uuid, check=False)
        value_differs = rc != 0 or out.strip() != key
    result = {"changed": bool(diff) or value_differs, "defined": bool(diff),
              "value_set": value_differs, "diff_fields": diff}
    if mod.check_mode or not result["changed"]:
        mod.exit_json(**result)

    tmp = tempfile.mkdtemp(prefix="cutpoint-secret-")  # 0700: only root reads the key file
    try:
        if diff:
            with open(os.path.join(tmp, "secret.xml"), "w", encoding="utf-8") as f:
                f.write(xml)
            virsh("secret-define", os.path.join(tmp, "secret.xml"))
        if value_differs:
            fd = os.open(os.path.join(tmp, "key"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(key)
            # --file: base64 read from a file, not from argv (which ps shows)
            virsh("secret-set-value", "--secret", uuid, "--file", os.path.join(tmp, "key"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    mod.exit_json(**result)


if __name__ == "__main__":
    main()
