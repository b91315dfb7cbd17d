"""Debian guest images for the database drills, built from recipes.

A recipe is a folder under ``dr-tests/images/debian/<name>/`` holding
``recipe.json`` (suite, variant, packages, kernel command line), an
``overlay/`` tree copied into the root, and ``customize.sh`` run on the
finished root.  The build is::

    mmdebstrap --variant=apt --include=... bookworm <tmp>/root
    cp -a overlay/. root/ ; customize.sh root        (mmdebstrap hooks)
    copy root/boot/vmlinuz-* and initrd.img-* out     (direct kernel boot)
    mkfs.ext4 -d root root.raw                        (never mounted)
    [qemu-img convert -O qcow2 root.raw root.qcow2]

and the result lands in ``/var/cache/cutpoint/images/<hash>/`` where the
hash covers every recipe file and this module.  A finished build is renamed
into place in one step, under an exclusive lock, so concurrent callers
build once and nobody sees half an image.  Images are never committed.

CLI: ``python -m cutpoint.lab.debian_image build debian-pg``.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CACHE_ROOT = Path(os.environ.get("CUTPOINT_IMAGE_CACHE",
                                  "/var/cache/cutpoint/images"))
RECIPES = Path(__file__).resolve().parent.parent / "images" / "debian"
# Bump when the build procedure below changes in a way that changes images;
# it is part of the recipe hash (edits that do not change images do not
# force a rebuild).
BUILDER_VERSION = "2"
# Recipe names as the CLI knows them -> recipe folder.
KNOWN = {"debian-pg": "pg", "debian-cassandra": "cassandra", "debian-host": "host"}
# Maven artifacts a recipe names (``"maven_pom"``) are fetched on the host
# into this cache, keyed by the pom's hash, and handed to customize.sh.
MAVEN_CACHE = Path(os.environ.get("CUTPOINT_MAVEN_CACHE",
                                  "/var/cache/cutpoint/maven"))


class ImageBuildError(RuntimeError):
    """A build step failed; carries the command and what it printed."""

    def __init__(self, step: str, argv: list[str], rc: int, output: str):
        self.step, self.argv, self.rc, self.output = step, argv, rc, output
        tail = output[-3000:]
        super().__init__(f"image build step {step!r} failed (rc={rc}): "
                         f"{' '.join(argv)}\n{tail}")


@dataclass(frozen=True)
class Image:
    """A built image in the cache."""

    name: str
    hash: str
    dir: Path
    root: Path          # root.raw or root.qcow2
    root_format: str    # "raw" | "qcow2"
    kernel: Path
    initrd: Path
    cmdline: str
    manifest: dict[str, Any]


def recipe_dir(name: str) -> Path:
    if name not in KNOWN:
        raise ValueError(f"unknown image {name!r}; known: {sorted(KNOWN)}")
    d = RECIPES / KNOWN[name]
    if not (d / "recipe.json").is_file():
        raise FileNotFoundError(f"recipe {d}/recipe.json is missing")
    return d


def recipe_hash(rdir: Path, fmt: str = "raw") -> str:
    """sha256 over every recipe file (path, mode, bytes), BUILDER_VERSION
    and the output format: any change gives a new cache entry."""
    h = hashlib.sha256()
    for p in sorted(rdir.rglob("*")):
        if p.is_file():
            rel = p.relative_to(rdir).as_posix()
            h.update(f"{rel}\0{p.stat().st_mode & 0o777:o}\0".encode())
            h.update(p.read_bytes())
    h.update(BUILDER_VERSION.encode())
    h.update(fmt.encode())
    return h.hexdigest()[:16]


def _run(step: str, argv: list[str], log: Path) -> float:
    t0 = time.monotonic()
    with open(log, "ab") as lf:
        lf.write(f"\n### {step}: {' '.join(argv)}\n".encode())
        lf.flush()
        p = subprocess.run(argv, stdout=lf, stderr=subprocess.STDOUT,
                           check=False)
    if p.returncode != 0:
        raise ImageBuildError(step, argv, p.returncode,
                              log.read_text(errors="replace"))
    return time.monotonic() - t0


def _du_mb(root: Path) -> int:
    out = subprocess.run(["du", "-sxm", str(root)], capture_output=True,
                         text=True, check=True).stdout
    return int(out.split()[0])


def _load(name: str, d: Path) -> Image:
    m = json.loads((d / "manifest.json").read_text())
    return Image(name=name, hash=m["hash"], dir=d, root=d / m["root"],
                 root_format=m["root_format"], kernel=d / m["kernel"],
                 initrd=d / m["initrd"], cmdline=m["cmdline"], manifest=m)


def maven_jars(pom: Path, log: Path) -> Path:
    """``mvn dependency:copy-dependencies`` of ``pom`` (runtime scope) into
    ``MAVEN_CACHE/<pom hash>/lib``, once; returns that folder."""
    h = hashlib.sha256(pom.read_bytes()).hexdigest()[:16]
    d = MAVEN_CACHE / h
    if (d / "done").is_file():
        return d / "lib"
    d.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(d / "lib", ignore_errors=True)
    _run("maven", ["mvn", "-q", "-B", "-f", str(pom),
                   "dependency:copy-dependencies", "-DincludeScope=runtime",
                   f"-DoutputDirectory={d / 'lib'}"], log)
    (d / "done").write_text(time.strftime("%Y-%m-%dT%H:%M:%SZ\n",
                                          time.gmtime()))
    return d / "lib"


def cached(name: str, fmt: str = "raw",
           cache_root: Path = CACHE_ROOT) -> Image | None:
    h = recipe_hash(recipe_dir(name), fmt)
    d = cache_root / h
    if (d / "manifest.json").is_file():
        return _load(name, d)
    return None


def build(name: str, fmt: str = "raw", cache_root: Path = CACHE_ROOT,
          force: bool = False) -> Image:
    """Build (or return the cached) image ``name``; output ``raw``|``qcow2``."""
    if fmt not in ("raw", "qcow2"):
        raise ValueError(f"format must be raw or qcow2, not {fmt!r}")
    rdir = recipe_dir(name)
    recipe = json.loads((rdir / "recipe.json").read_text())
    h = recipe_hash(rdir, fmt)
    cache_root.mkdir(parents=True, exist_ok=True)
    final = cache_root / h
    with open(cache_root / ".lock", "w") as lockf:
        # One builder at a time per cache: mmdebstrap is CPU and disk heavy.
        fcntl.flock(lockf, fcntl.LOCK_EX)
        if (final / "manifest.json").is_file() and not force:
            return _load(name, final)
        work = Path(tempfile.mkdtemp(prefix=f".build-{h}-", dir=cache_root))
        try:
            manifest = _build_into(work, rdir, recipe, h, fmt, name)
            (work / "out" / "manifest.json").write_text(
                json.dumps(manifest, indent=2) + "\n")
            if final.exists():
                shutil.rmtree(final)
            os.rename(work / "out", final)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return _load(name, final)


def _build_into(work: Path, rdir: Path, recipe: dict[str, Any], h: str,
                fmt: str, name: str) -> dict[str, Any]:
    root, out, log = work / "root", work / "out", work / "build.log"
    out.mkdir()
    timings: dict[str, float] = {}
    hook_extra = ""
    if "maven_pom" in recipe:
        t0 = time.monotonic()
        hook_extra = " " + str(maven_jars(rdir / recipe["maven_pom"], log))
        timings["maven_s"] = time.monotonic() - t0
    argv = [
        "mmdebstrap", f"--variant={recipe.get('variant', 'apt')}",
        "--include=" + ",".join(recipe["packages"]),
        # Documentation and translations are never unpacked at all.
        "--dpkgopt=path-exclude=/usr/share/doc/*",
        "--dpkgopt=path-exclude=/usr/share/man/*",
        "--dpkgopt=path-exclude=/usr/share/locale/*",
        "--dpkgopt=path-exclude=/usr/share/info/*",
        # A recipe's setup hooks run before any package is unpacked.
        *[f"--setup-hook={h}" for h in recipe.get("setup_hooks", [])],
        f"--customize-hook=cp -a {rdir}/overlay/. \"$1\"/",
        f"--customize-hook=sh {rdir}/customize.sh \"$1\"{hook_extra}",
        recipe.get("suite", "bookworm"), str(root),
        recipe.get("mirror", "http://deb.debian.org/debian"),
    ]
    timings["mmdebstrap_s"] = _run("mmdebstrap", argv, log)
    boot = root / "boot"
    kernels = sorted(boot.glob("vmlinuz-*"))
    initrds = sorted(boot.glob("initrd.img-*"))
    if not kernels or not initrds:
        raise ImageBuildError("extract-kernel", ["ls", str(boot)], 1,
                              f"no vmlinuz-*/initrd.img-* in {boot}: "
                              f"{os.listdir(boot)}")
    shutil.copy2(kernels[-1], out / "vmlinuz")
    shutil.copy2(initrds[-1], out / "initrd.img")
    # The VM boots them directly; copies inside the root are dead weight.
    for f in kernels + initrds:
        f.unlink()
    used = _du_mb(root)
    size_mb = used + int(recipe.get("root_slack_mb", 384))
    raw = out / "root.raw"
    timings["mkfs_s"] = _run("mkfs.ext4", [
        "mkfs.ext4", "-q", "-F", "-L", "cproot", "-d", str(root),
        "-E", "lazy_itable_init=0,lazy_journal_init=0",
        str(raw), f"{size_mb}M"], log)
    rootname = "root.raw"
    if fmt == "qcow2":
        timings["qcow2_s"] = _run("qemu-img", [
            "qemu-img", "convert", "-O", "qcow2", str(raw),
            str(out / "root.qcow2")], log)
        raw.unlink()
        rootname = "root.qcow2"
    shutil.copy2(log, out / "build.log")
    pkgs = subprocess.run(
        ["chroot", str(root), "dpkg-query", "-W",
         "-f=${Package} ${Version}\n"], capture_output=True, text=True,
        check=False)
    (out / "packages.txt").write_text(pkgs.stdout)
    alloc = os.stat(out / rootname).st_blocks * 512
    return {
        "name": name, "hash": h, "root": rootname, "root_format": fmt,
        "kernel": "vmlinuz", "initrd": "initrd.img",
        "kernel_version": kernels[-1].name.removeprefix("vmlinuz-"),
        "cmdline": recipe["kernel_cmdline"],
        "tree_mb": used, "fs_size_mb": size_mb,
        "root_allocated_mb": round(alloc / 2**20, 1),
        "packages": len(pkgs.stdout.splitlines()),
        "timings": {k: round(v, 1) for k, v in timings.items()},
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m cutpoint.lab.debian_image")
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build (or reuse) a cached image")
    b.add_argument("name", choices=sorted(KNOWN))
    b.add_argument("--format", default="raw", choices=["raw", "qcow2"])
    b.add_argument("--force", action="store_true")
    s = sub.add_parser("show", help="print the cached image's manifest")
    s.add_argument("name", choices=sorted(KNOWN))
    s.add_argument("--format", default="raw", choices=["raw", "qcow2"])
    a = ap.parse_args(argv)
    if a.cmd == "build":
        t0 = time.monotonic()
        try:
            img = build(a.name, a.format, force=a.force)
        except ImageBuildError as e:
            print(e, file=sys.stderr)
            return 1
        print(json.dumps({"dir": str(img.dir), "seconds":
                          round(time.monotonic() - t0, 1), **img.manifest},
                         indent=2))
        return 0
    shown = cached(a.name, a.format)
    if shown is None:
        print(f"{a.name} ({a.format}) is not built; run build", file=sys.stderr)
        return 1
    print(json.dumps({"dir": str(shown.dir), **shown.manifest}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
