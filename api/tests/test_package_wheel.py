"""`make package`'s wheel is the product alone: the control plane's packages
and the `cutpoint` command, no test bed (cutpoint.lab, .checkers, .bench)
and no `cutpoint-lab`.  Installed on its own (pip --target, with the
dependencies of this checkout's .venv on the path but not its editable
cutpoint), `cutpoint --help` runs and lists the operator's commands."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _wheel() -> Path:
    subprocess.run([str(ROOT / "scripts/package.sh")], cwd=ROOT, check=True, timeout=600,
                   capture_output=True)
    version = (ROOT / "VERSION").read_text().strip()
    whl = ROOT / "out" / "packages" / f"cutpoint-{version}-py3-none-any.whl"
    assert whl.is_file(), whl
    return whl


def test_the_wheel_is_the_product_alone(tmp_path: Path) -> None:
    whl = _wheel()
    names = zipfile.ZipFile(whl).namelist()
    tops = {"/".join(n.split("/")[:2]) for n in names if n.startswith("cutpoint/")}
    assert tops == {"cutpoint/api", "cutpoint/coordinator", "cutpoint/agentclient"}, tops
    assert any("cutpoint/api/alembic/versions/" in n for n in names), "no migrations"
    entry = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    points = zipfile.ZipFile(whl).read(entry).decode()
    assert "cutpoint = cutpoint.api.cli.main:main" in points
    assert "cutpoint-lab" not in points and "cutpoint.lab" not in points, points

    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target",
                    str(target), str(whl)], check=True, timeout=300, capture_output=True)
    assert (target / "bin" / "cutpoint").exists()
    assert not (target / "bin" / "cutpoint-lab").exists()
    # The .venv's dependencies, without its .pth files (so not its editable
    # cutpoint): the wheel's cutpoint is the one imported.
    env = dict(os.environ, PYTHONPATH=f"{target}:{sysconfig.get_paths()['purelib']}",
               PYTHONNOUSERSITE="1")
    run = [sys.executable, "-S", "-c",
           ("import cutpoint.api, sys; print(cutpoint.api.__file__);"
            "from cutpoint.api.cli.main import main; sys.argv=['cutpoint','--help']; main()")]
    r = subprocess.run(run, env=env, capture_output=True, text=True, timeout=120, check=False)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert out.splitlines()[0].startswith(str(target)), out.splitlines()[0]
    for cmd in ("group", "site", "dr", "restore", "drill"):
        assert f" {cmd} " in out, cmd
    assert " lab " not in out, out
    r = subprocess.run([sys.executable, "-S", "-c", "import cutpoint.lab"], env=env,
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode != 0 and "No module named 'cutpoint.lab'" in r.stderr, r.stderr
