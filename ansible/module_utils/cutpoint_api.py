"""The cutpoint API as the modules in ../library reach it: JSON over HTTP
with a bearer token, every failure an ApiError carrying the method, the
path, what was sent and what came back (the problem document)."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.parse
import urllib.request


class ApiError(Exception):
    def __init__(self, method, path, sent, status, received):
        self.method, self.path, self.sent = method, path, sent
        self.status, self.received = status, received
        super().__init__(f"{method} {path} sent {sent!r} -> HTTP {status}: {received}")

    def problem(self):
        """The problem document the API answered, or None."""
        try:
            doc = json.loads(self.received)
        except (TypeError, ValueError):
            return None
        return doc if isinstance(doc, dict) else None


# TLS context of HTTPS API URLs (set from the module's ca_file / validate_certs).
_SSL = None


def configure_tls(module):
    """An HTTPS API: trust `ca_file` when given; `validate_certs: false` only
    for the control machine's own listener over loopback, whose certificate
    names the machine, not 127.0.0.1."""
    global _SSL
    p = module.params
    if p.get("validate_certs") is False:
        _SSL = ssl.create_default_context()
        _SSL.check_hostname = False
        _SSL.verify_mode = ssl.CERT_NONE
    elif p.get("ca_file"):
        _SSL = ssl.create_default_context(cafile=p["ca_file"])


def call(base, token, method, path, body=None, timeout=30):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(base.rstrip("/") + path, data=data, method=method)
    req.add_header("Authorization", f"Bearer {token}")
    req.add_header("Accept", "application/json")
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=_SSL) as resp:
            raw = resp.read()
            return json.loads(raw) if raw else None
    except urllib.error.HTTPError as exc:
        raise ApiError(method, path, body, exc.code, exc.read().decode(errors="replace")) from exc
    except urllib.error.URLError as exc:
        raise ApiError(method, path, body, None, str(exc.reason)) from exc


def list_all(base, token, path):
    """Every item of a paginated collection."""
    items, cursor = [], None
    while True:
        q = {"limit": 500}
        if cursor:
            q["cursor"] = cursor
        page = call(base, token, "GET", f"{path}?{urllib.parse.urlencode(q)}")
        items.extend(page["items"])
        cursor = page.get("next_cursor")
        if not cursor:
            return items


def read_token(module):
    """The token from `token`, else from the file `token_file` (fails the module)."""
    p = module.params
    if p.get("token"):
        return p["token"]
    if not p.get("token_file"):
        module.fail_json(msg="either token or token_file is required")
    try:
        with open(p["token_file"], encoding="utf-8") as f:
            return f.read().strip()
    except OSError as exc:
        module.fail_json(msg=f"cannot read token_file {p['token_file']}: {exc}")
    return None
