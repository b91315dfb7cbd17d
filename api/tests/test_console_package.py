"""The wheel carries the web console: every template, the style sheet, and
htmx as scripts/setup.sh fetched it (a wheel-installed control node has no
checkout and no npm)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONSOLE = ROOT / "api" / "console"


def test_wheel_contains_the_console(tmp_path: Path) -> None:
    htmx = CONSOLE / "static" / "htmx.min.js"
    assert htmx.is_file(), "scripts/setup.sh fetches htmx: run `make setup`"
    # A stale staging tree would hide files that setup.cfg fails to declare.
    shutil.rmtree(ROOT / "build-py", ignore_errors=True)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "-w", str(tmp_path), str(ROOT)],
                   check=True, capture_output=True, timeout=300)
    (wheel,) = tmp_path.glob("cutpoint-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        wanted = {f"cutpoint/api/console/templates/{p.name}"
                  for p in (CONSOLE / "templates").glob("*.html")}
        wanted |= {"cutpoint/api/console/assets/console.css",
                   "cutpoint/api/console/static/htmx.min.js"}
        assert len(wanted) > 10 and not sorted(wanted - names), sorted(wanted - names)
        assert z.read("cutpoint/api/console/static/htmx.min.js") == htmx.read_bytes()
