"""The wheel carries everything a wheel-installed control node needs.

An Ansible-provisioned control node installs cutpoint from its wheel, not
from a checkout, and then runs the Alembic migrations: so every revision
must be inside the wheel.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_wheel_contains_alembic_environment_and_every_revision(tmp_path: Path) -> None:
    # A stale staging tree would hide files that setup.cfg fails to declare.
    shutil.rmtree(ROOT / "build-py", ignore_errors=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
         "-w", str(tmp_path), str(ROOT)],
        check=True, capture_output=True, timeout=300,
    )
    (wheel,) = tmp_path.glob("cutpoint-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    wanted = {"cutpoint/api/alembic.ini", "cutpoint/api/alembic/env.py",
              "cutpoint/api/alembic/script.py.mako"}
    wanted |= {f"cutpoint/api/alembic/versions/{p.name}"
               for p in (ROOT / "api/alembic/versions").glob("*.py")}
    missing = sorted(wanted - names)
    assert not missing, f"wheel {wheel.name} lacks {missing}"
