"""cutpoint-sync's command line without a cluster: bad input is refused
with exit 2 and one clear line, an unreadable config with exit 1 and an
`error` event, before anything touches Ceph.  The engine itself is tested
against the lab in test_sync.py."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from cutpoint.bench.replication import sync_binary

BASE = ["--src-conf", "/nonexistent/primary.conf", "--dst-conf", "/nonexistent/dr.conf",
        "--image", "img", "--snap", "s1"]


def run(*args: str, state: Path | None = None) -> subprocess.CompletedProcess[str]:
    argv = [sync_binary(), *args]
    if state is not None:
        argv += ["--state-dir", str(state)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize(("args", "message"), [
    ([], "--src-conf and --dst-conf are required"),
    (["--src-conf", "a", "--dst-conf", "b", "--snap", "s"], "--image is required"),
    (["--src-conf", "a", "--dst-conf", "b", "--image", "i"], "--snap is required"),
    ([*BASE, "--base", "s1"], "--base and --snap name the same snapshot"),
    ([*BASE, "--rate-mbps", "fast"], "--rate-mbps wants a number"),
    ([*BASE, "--rate-mbps", "-1"], "--rate-mbps wants a number"),
    ([*BASE, "--chunk-kib", "6"], "--chunk-kib wants a multiple of 4"),
    ([*BASE, "--jobs", "0"], "--jobs wants an integer"),
    ([*BASE, "--op-timeout", "0"], "--op-timeout wants an integer from 1 to 3600"),
    ([*BASE, "--extent-verify", "maybe"], "--extent-verify wants osd or readback"),
    ([*BASE, "--verify-only", "--full-resync"], "--verify-only takes no --base"),
    ([*BASE, "--epoch", "-1"], "--epoch wants a whole number"),
    ([*BASE, "--epoch", "1.5"], "--epoch wants a whole number"),
    ([*BASE, "extra"], "unexpected positional argument"),
])
def test_bad_usage_exits_2(args: list[str], message: str) -> None:
    cp = run(*args)
    assert cp.returncode == 2, cp.stderr
    assert message in cp.stderr
    assert cp.stdout == ""


def test_unknown_option_exits_2() -> None:
    cp = run(*BASE, "--no-such-option")
    assert cp.returncode == 2
    assert "usage: cutpoint-sync" in cp.stderr


def test_help_and_version() -> None:
    cp = run("--help")
    assert cp.returncode == 0 and "exit: 0 ok, 1 error, 2 usage, 3 base missing" in cp.stdout
    cp = run("--version")
    assert cp.returncode == 0 and cp.stdout.startswith("cutpoint-sync ")


def test_unreadable_config_is_error_event(tmp_path: Path) -> None:
    cp = run(*BASE, state=tmp_path)
    assert cp.returncode == 1
    ev = json.loads(cp.stdout.strip().splitlines()[-1])
    assert ev["event"] == "error" and ev["exit"] == 1
    assert "/nonexistent/primary.conf" in ev["message"]
    assert "level=error" in cp.stderr and "exit=1" in cp.stderr


def test_second_run_on_same_image_is_refused(tmp_path: Path) -> None:
    """The run lock: while one run holds it, another on the same image fails."""
    import fcntl

    lock = tmp_path / "rbd%40img.progress.lock"
    with open(lock, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        cp = run(*BASE, state=tmp_path)
    assert cp.returncode == 1
    assert "another cutpoint-sync is copying this image" in cp.stdout


def test_serve_takes_no_image_of_its_own() -> None:
    cp = run("--serve", "--src-conf", "a", "--dst-conf", "b", "--image", "i")
    assert cp.returncode == 2 and "--serve takes its images from stdin" in cp.stderr


def test_serve_with_an_unreadable_config_is_an_error_event(tmp_path: Path) -> None:
    """The session connects first: a site it cannot connect ends it with
    exit 1 and an error event that names no image."""
    cp = subprocess.run([sync_binary(), "--serve", "--src-conf", "/nonexistent/primary.conf",
                         "--dst-conf", "/nonexistent/dr.conf", "--state-dir", str(tmp_path)],
                        input='{"image":"i","snap":"s"}\n', capture_output=True, text=True,
                        timeout=60, check=False)
    assert cp.returncode == 1
    ev = json.loads(cp.stdout.strip().splitlines()[-1])
    assert ev["event"] == "error" and ev["exit"] == 1 and "image" not in ev
    assert "/nonexistent/" in ev["message"]
