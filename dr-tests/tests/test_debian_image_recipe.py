"""Unit tests of the Debian image recipe handling (no build, no root)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from cutpoint.lab import debian_image as di


def test_pg_recipe_is_complete() -> None:
    d = di.recipe_dir("debian-pg")
    r = json.loads((d / "recipe.json").read_text())
    for pkg in ("systemd-sysv", "udev", "iproute2", "kmod",
                "linux-image-amd64", "qemu-guest-agent", "postgresql-15"):
        assert pkg in r["packages"]
    assert r["variant"] == "apt" and r["suite"] == "bookworm"
    sbin = d / "overlay" / "usr" / "local" / "sbin"
    for script in ("cp-disks", "cp-pg-init", "cp-workload", "cp-ledger",
                   "cp-check"):
        assert (sbin / script).stat().st_mode & 0o111, script


def test_unknown_recipe_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="unknown image 'debian-nope'"):
        di.recipe_dir("debian-nope")


def test_hash_changes_with_any_recipe_byte_mode_and_format(tmp_path: Path) -> None:
    src = di.recipe_dir("debian-pg")
    copy = tmp_path / "pg"
    shutil.copytree(src, copy)
    h0 = di.recipe_hash(copy)
    assert h0 == di.recipe_hash(src)            # content-addressed, not path
    assert di.recipe_hash(copy, "qcow2") != h0
    f = copy / "overlay" / "usr" / "local" / "sbin" / "cp-check"
    f.write_bytes(f.read_bytes() + b"\n")
    h1 = di.recipe_hash(copy)
    assert h1 != h0
    f.chmod(0o644)
    assert di.recipe_hash(copy) != h1


def test_bad_format_is_rejected_before_any_work(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="raw or qcow2"):
        di.build("debian-pg", fmt="vmdk", cache_root=tmp_path)
    assert not any(tmp_path.iterdir())


def test_cached_returns_none_for_an_empty_cache(tmp_path: Path) -> None:
    assert di.cached("debian-pg", cache_root=tmp_path) is None


def _dist(req: str) -> str:
    """The distribution name of a requirement line: `celery[redis]>=5.3` -> celery."""
    import re

    return re.split(r"[\[<>=!~ ;]", req.strip(), maxsplit=1)[0].lower().replace("_", "-")


def test_host_image_pre_installs_every_runtime_dependency() -> None:
    """The control VM installs cutpoint with --no-index from a wheelhouse of
    the cutpoint wheel alone: every install_requires of setup.cfg must be
    pre-installed by the host image, else `make test-ansible` fails at the
    pip step (as it did when the console added jinja2)."""
    import configparser

    cfg = configparser.ConfigParser()
    cfg.read(Path(__file__).resolve().parents[2] / "setup.cfg")
    needed = {_dist(r) for r in cfg["options"]["install_requires"].splitlines()
              if r.strip() and not r.strip().startswith("#")}
    req = di.recipe_dir("debian-host") / "requirements.txt"
    baked = {_dist(r) for r in req.read_text().splitlines()
             if r.strip() and not r.startswith("#")}
    assert needed and needed <= baked, f"missing from {req}: {sorted(needed - baked)}"
