"""docs/api.md's route table is the OpenAPI document, regenerated: the test
fails when a route, its role, body or answers changed and `make docs` was not
run; and the role the document declares for each operation is the one the
auth matrix enforces."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from test_auth_matrix import REQUIRED

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))


def test_api_reference_matches_the_openapi_document(tmp_path: Path) -> None:
    out = tmp_path / "api.md"
    subprocess.run([sys.executable, str(ROOT / "scripts/api-docs.py"), str(out)], check=True,
                   timeout=120, capture_output=True)
    have = (ROOT / "docs/api.md").read_text()
    assert have == out.read_text(), "docs/api.md is out of date: run `make docs`"
    for row in ("| POST | `/v1/groups/{group}/failover` | admin |",
                "| POST | `/v1/groups/{group}/restore/in-place` | admin |",
                "| POST | `/v1/sites/{site_id}/check` | operator |"):
        assert row in have, row


def test_the_document_declares_the_role_the_matrix_enforces() -> None:
    import importlib

    api_docs = importlib.import_module("api-docs")
    doc = api_docs.openapi()
    declared = {(m.upper(), p): op.get("x-required-role")
                for p, ops in doc["paths"].items() for m, op in ops.items()
                if p.startswith("/v1/")}
    assert declared == dict(REQUIRED)
