"""run_rbd: a read-only rbd query whose CLI crashed is asked once more;
a command that changes state is never repeated.

The `rbd` here is a stand-in program on PATH that records each call and
aborts (SIGABRT, as Ceph's signal handler ends a crash) on the first one.
It stands in for the CLI crashing, not for the cluster: run_rbd's only
job is the decision to ask again.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from cutpoint.lab.ceph import run_rbd

SITE = {"ceph_conf": "/nonexistent/ceph.conf", "keyring": "/nonexistent/keyring"}

FAKE_RBD = """#!/bin/sh
echo "$*" >> "{calls}"
if [ ! -e "{crashed}" ]; then
    touch "{crashed}"
    echo "*** Caught signal (Aborted) ** in thread 7f00 thread_name:msgr-worker-1" >&2
    kill -ABRT $$
fi
echo '{{"watchers": []}}'
"""


@pytest.fixture
def fake_rbd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    calls = tmp_path / "calls"
    prog = tmp_path / "bin" / "rbd"
    prog.parent.mkdir()
    prog.write_text(FAKE_RBD.format(calls=calls, crashed=tmp_path / "crashed"))
    prog.chmod(prog.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{prog.parent}{os.pathsep}{os.environ['PATH']}")
    return calls


def test_a_crashed_query_is_asked_again(fake_rbd: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    p = run_rbd(SITE, "status", "--format", "json", "rbd/img")
    assert p.returncode == 0 and '"watchers"' in p.stdout
    assert len(fake_rbd.read_text().splitlines()) == 2
    err = capsys.readouterr().err
    assert "killed by signal 6" in err and "Caught signal (Aborted)" in err


def test_snap_ls_is_a_query(fake_rbd: Path) -> None:
    assert run_rbd(SITE, "snap", "ls", "rbd/img").returncode == 0
    assert len(fake_rbd.read_text().splitlines()) == 2


def test_a_crashed_change_is_not_repeated(fake_rbd: Path) -> None:
    p = run_rbd(SITE, "snap", "create", "rbd/img@s1")
    assert p.returncode == -6
    only_call = (f"-c {SITE['ceph_conf']} --id admin --keyring {SITE['keyring']} "
                 "snap create rbd/img@s1")
    assert fake_rbd.read_text().splitlines() == [only_call]
