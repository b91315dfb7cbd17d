"""The tiny guest image: host Debian kernel + busybox initramfs, cached.

The recipe is `dr-tests/images/tiny/` (init script, module list).  The
image also carries Debian's qemu-guest-agent (`/usr/sbin/qemu-ga`, package
qemu-guest-agent, with the shared libraries `ldd` names and the dynamic
loader), which the init starts on the virtio-serial port
`org.qemu.guest_agent.0` when the VM has one: lab guests answer
guest-ping and guest-exec like any guest.  The cache key hashes every
input byte: the builder version, the init script, the module list, the
kernel, each resolved module file, busybox, qemu-ga and its libraries,
and every workload binary `build/dr-tests/workloads/*/cp-*` that exists.  A cached
image lives in `/var/cache/cutpoint/images/<hash>/` (vmlinuz, initrd.img,
recipe.json) and is built in a temp dir and renamed into place, so
concurrent builders never see a half-written image.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from cutpoint.lab import config as C
from cutpoint.lab.errors import LabError
from cutpoint.lab.proc import run

BUILDER_VERSION = "tiny-3"
REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "dr-tests" / "images" / "tiny"
BUSYBOX = "/bin/busybox"
QEMU_GA = "/usr/sbin/qemu-ga"


def kernel_version(kernel: str) -> str:
    m = re.match(r"vmlinuz-(.+)$", os.path.basename(kernel))
    if not m:
        raise LabError(f"cannot tell the version of kernel {kernel}: expected a name vmlinuz-<version>")
    ver = m.group(1)
    if not Path(f"/lib/modules/{ver}").is_dir():
        raise LabError(f"no modules for kernel {kernel}: /lib/modules/{ver} is absent")
    return ver


def resolve_modules(names: list[str], kver: str) -> list[tuple[str, str]]:
    """(name, path) in load order: dependencies first (modinfo -F depends)."""
    order: list[tuple[str, str]] = []
    seen: set[str] = set()

    def visit(name: str, chain: tuple[str, ...]) -> None:
        name = name.replace("-", "_")
        if name in seen:
            return
        if name in chain:
            raise LabError(f"module dependency cycle: {' -> '.join(chain + (name,))}")
        deps = run(["modinfo", "-k", kver, "-F", "depends", name]).stdout.strip()
        for dep in filter(None, deps.split(",")):
            visit(dep, chain + (name,))
        path = run(["modinfo", "-k", kver, "-n", name]).stdout.strip()
        if not path.startswith("/"):  # built into the kernel
            seen.add(name)
            return
        seen.add(name)
        order.append((name, path))

    for n in names:
        visit(n, ())
    return order


def guest_agent_files() -> list[str]:
    """qemu-ga and what it loads: its shared libraries and the dynamic
    loader, as `ldd` resolves them on this machine (absolute paths)."""
    if not os.access(QEMU_GA, os.X_OK):
        raise LabError(f"{QEMU_GA} is missing: install Debian's qemu-guest-agent "
                       "(scripts/debian-packages.txt; scripts/setup.sh installs it)")
    out = run(["ldd", QEMU_GA]).stdout
    files = [QEMU_GA]
    for line in out.splitlines():
        m = re.search(r"(/\S+) \(0x", line)
        if m and m.group(1) not in files:
            files.append(m.group(1))
    return files


def workload_binaries() -> list[Path]:
    base = Path(os.environ.get("CUTPOINT_WORKLOADS_DIR") or REPO / "build" / "dr-tests" / "workloads")
    return sorted(p for p in base.glob("*/cp-*") if p.is_file() and os.access(p, os.X_OK))


def _sha(path: Path | str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def recipe(kernel: str) -> dict[str, Any]:
    kver = kernel_version(kernel)
    names = [ln.split("#")[0].strip() for ln in (RECIPE / "modules.txt").read_text().splitlines()]
    mods = resolve_modules([n for n in names if n], kver)
    wl = workload_binaries()
    inputs = {
        "builder": BUILDER_VERSION,
        "init": _sha(RECIPE / "init"),
        "modules.txt": _sha(RECIPE / "modules.txt"),
        "kernel": {"path": kernel, "sha256": _sha(kernel), "version": kver},
        "modules": [{"name": n, "path": p, "sha256": _sha(p)} for n, p in mods],
        "busybox": _sha(BUSYBOX),
        "guest_agent": [{"name": p, "sha256": _sha(p)} for p in guest_agent_files()],
        "workloads": [{"name": p.name, "path": str(p), "sha256": _sha(p)} for p in wl],
    }
    key = json.dumps({k: v for k, v in inputs.items()}, sort_keys=True)
    # Paths do not change the image, only contents do.
    key = re.sub(r'"path": "[^"]*", ', "", key)
    inputs["hash"] = hashlib.sha256(key.encode()).hexdigest()[:16]
    return inputs


def build(kernel: str, cache: str | Path = C.IMAGE_CACHE, log: Any = print) -> dict[str, Any]:
    """Return {kernel, initrd, hash, dir, workloads}, building if not cached."""
    r = recipe(kernel)
    root = Path(cache)
    d = root / r["hash"]
    info = {"kernel": str(d / "vmlinuz"), "initrd": str(d / "initrd.img"), "hash": r["hash"],
            "dir": str(d), "workloads": [w["name"] for w in r["workloads"]],
            "kernel_version": r["kernel"]["version"]}
    if (d / "recipe.json").is_file():
        info["cached"] = True
        return info
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".build-{r['hash']}-", dir=root))
    try:
        st = tmp / "root"
        for sub in ("bin", "usr/bin", "etc", "lib/modules", "dev", "proc", "sys", "tmp"):
            (st / sub).mkdir(parents=True)
        shutil.copy2(BUSYBOX, st / "bin" / "busybox")
        shutil.copy2(RECIPE / "init", st / "init")
        os.chmod(st / "init", 0o755)
        for m in r["modules"]:
            shutil.copy2(m["path"], st / "lib" / "modules" / f"{m['name']}.ko")
        (st / "etc" / "cp-modules").write_text("".join(m["name"] + "\n" for m in r["modules"]))
        for w in r["workloads"]:
            shutil.copy2(w["path"], st / "usr" / "bin" / w["name"])
        for g in r["guest_agent"]:  # at the same paths: the loader finds them
            dst = st / g["name"].lstrip("/")
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(g["name"], dst)  # follows symlinks: the library itself
        # The kernel opens /dev/console before init runs (no devtmpfs yet).
        os.mknod(st / "dev" / "console", 0o600 | 0o020000, os.makedev(5, 1))
        files = subprocess.run(["find", "."], cwd=st, capture_output=True, text=True,
                               check=True).stdout
        with open(tmp / "initrd.img", "wb") as out:
            cp = subprocess.run(["cpio", "--quiet", "-o", "-H", "newc", "--reproducible"],
                                check=False, cwd=st, input=files.encode(), stdout=out,
                                stderr=subprocess.PIPE)
        if cp.returncode != 0:
            raise LabError(f"cpio failed: {cp.stderr.decode(errors='replace').strip()}")
        shutil.rmtree(st)
        os.chmod(tmp, 0o755)
        shutil.copy2(kernel, tmp / "vmlinuz")
        (tmp / "recipe.json").write_text(json.dumps(r, indent=2) + "\n")
        try:
            os.rename(tmp, d)
        except OSError:
            if not (d / "recipe.json").is_file():
                raise
        log(f"image: built tiny image {r['hash']} "
            f"({len(r['modules'])} modules, workloads: {', '.join(info['workloads']) or 'none'})")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    info["cached"] = False
    return info
