"""Unit tests of the debian-cassandra image recipe (no build, no root)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from cutpoint.lab import debian_image as di


def test_cassandra_recipe_is_complete() -> None:
    d = di.recipe_dir("debian-cassandra")
    r = json.loads((d / "recipe.json").read_text())
    for pkg in ("systemd-sysv", "qemu-guest-agent", "openjdk-17-jre-headless",
                "python3-cassandra", "linux-image-amd64"):
        assert pkg in r["packages"]
    pom = (d / r["maven_pom"]).read_text()
    assert "<artifactId>cassandra-all</artifactId>" in pom
    assert "<version>5.0.4</version>" in pom
    sbin = d / "overlay" / "usr" / "local" / "sbin"
    for script in ("cp-disks", "cp-net", "cp-cass-init", "cp-cassandra",
                   "cp-workload", "cp-writer", "cp-check"):
        assert (sbin / script).stat().st_mode & 0o111, script
    yaml_in = (d / "overlay" / "etc" / "cassandra" /
               "cassandra.yaml.in").read_text()
    assert "commitlog_sync: group" in yaml_in
    assert "commitlog_directory: /srv/clog/commitlog" in yaml_in


def test_pom_is_part_of_the_recipe_hash(tmp_path: Path) -> None:
    copy = tmp_path / "cassandra"
    shutil.copytree(di.recipe_dir("debian-cassandra"), copy)
    h0 = di.recipe_hash(copy)
    pom = copy / "pom.xml"
    pom.write_text(pom.read_text().replace("5.0.4", "5.0.5"))
    assert di.recipe_hash(copy) != h0
