"""A clean Debian 12 root for installing cutpoint's packages in: mmdebstrap
minbase plus exactly the packages asked for (the .deb's Depends), cached as
a tarball under /var/cache/cutpoint/pkgroot/ by the hash of that list, built
once under a lock.  Nothing of this machine's own packages leaks in: a
library missing from Depends is missing in the root."""

from __future__ import annotations

import fcntl
import hashlib
import subprocess
from pathlib import Path

CACHE = Path("/var/cache/cutpoint/pkgroot")
MIRROR = "http://deb.debian.org/debian"


def root_tarball(packages: list[str]) -> Path:
    key = hashlib.sha256(" ".join(sorted(packages)).encode()).hexdigest()[:16]
    CACHE.mkdir(parents=True, exist_ok=True)
    tar = CACHE / f"bookworm-{key}.tar"
    with open(CACHE / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not tar.exists():
            tmp = tar.with_suffix(".tmp.tar")
            subprocess.run(["mmdebstrap", "--variant=minbase", "--quiet",
                            f"--include={','.join(sorted(packages))}", "bookworm",
                            str(tmp), MIRROR], check=True, timeout=1200)
            tmp.rename(tar)
    return tar


def unpack(tar: Path, dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    # tar(1): device nodes, owners and modes as mmdebstrap wrote them
    subprocess.run(["tar", "-C", str(dest), "-xf", str(tar)], check=True, timeout=300)
    return dest
